"""A real local Kubernetes control plane: etcd + kube-apiserver + kube-controller-manager.

Everything listens on free 127.0.0.1 ports, uses certificates generated into ``state_dir``,
runs with ``--authorization-mode=Node,RBAC`` and a controller-manager that runs the garbage
collector, namespace, service-account and token controllers. In the light mode (default) there
are no nodes: pods stay Pending, which is what operator/chart tests need (objects, RBAC, GC, CRD
validation). ``chain=True`` adds kube-scheduler, kwok-simulated GPU nodes and the Kubeflow
training-operator (see :mod:`.chain`), so PyTorchJobs get real pods that are scheduled and run.

Readiness is always polled (``/health``, ``/readyz``, ``/healthz``), never slept for.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import ssl
import subprocess
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

from . import pki
from .process import (
    DevClusterError,
    free_port,
    http_get,
    is_running,
    log_tail,
    pid_record,
    read_pids,
    stop_pid,
    wait_until,
    write_pids,
)
from . import chain as chain_mod
from .tools import find_tool, kwok_stages_dir, pytorchjob_crd_path

__all__ = ["DevCluster", "start_etcd", "stop_process", "KubectlError"]

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
CLUSTER_NAME = "llmtrain-dev"

# Components start in this order and stop in reverse; the chain ones only with chain=True.
_LIGHT = ("etcd", "kube-apiserver", "kube-controller-manager")
_CHAIN = ("kube-scheduler", "training-operator", "kwok")
_STOP_ORDER = tuple(reversed(_LIGHT + _CHAIN))
# training-operator v1.9.3 keeps its webhook Secret here and its cert rotator only checks that
# a serving cert exists at a hard-coded path (pkg/cert: "/tmp/k8s-webhook-server/serving-certs").
TRAINING_OPERATOR_NAMESPACE = "kubeflow"
TRAINING_OPERATOR_SECRET = "training-operator-webhook-cert"
TRAINING_OPERATOR_ROTATOR_CERT = Path("/tmp/k8s-webhook-server/serving-certs/tls.crt")

# Controllers that need nodes, a cloud provider or volumes/kubelets; they only add noise here.
# Everything else stays on (garbage-collector, namespace, serviceaccount, serviceaccount-token,
# root-ca-certificate-publisher, replicaset, deployment, job, ...).
_DISABLED_CONTROLLERS = (
    "cloud-node-lifecycle-controller",
    "node-ipam-controller",
    "node-lifecycle-controller",
    "node-route-controller",
    "service-lb-controller",
    "persistentvolume-attach-detach-controller",
    "persistentvolume-binder-controller",
    "persistentvolume-expander-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
    "ephemeral-volume-controller",
    "taint-eviction-controller",
)


class KubectlError(subprocess.CalledProcessError):
    """kubectl exited non-zero; ``str()`` includes its stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


def _popen(cmd: Sequence[str], log_path: Path, *, env: dict | None = None) -> subprocess.Popen:
    """Start a component in its own session (it outlives the starter), output to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"\n# {' '.join(map(str, cmd))}\n".encode())
        log.flush()
        return subprocess.Popen(
            [str(c) for c in cmd],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            close_fds=True,
        )


def start_etcd(
    data_dir: Path | str,
    enable_v2: bool = True,
    *,
    log_path: Path | str | None = None,
    client_port: int | None = None,
    timeout: float = 60.0,
) -> tuple[subprocess.Popen, str]:
    """Start a single-member etcd on free 127.0.0.1 ports and wait until ``/health`` is true.

    Returns ``(process, client_url)``. ``enable_v2`` turns on the v2 API that torch's etcd
    rendezvous (python-etcd) speaks. Stop it with :func:`stop_process` (or terminate + wait).
    """
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    log = Path(log_path) if log_path else data_dir.parent / f"{data_dir.name}.etcd.log"
    cport = client_port or free_port()
    pport = free_port()
    client_url = f"http://127.0.0.1:{cport}"
    peer_url = f"http://127.0.0.1:{pport}"
    cmd = [
        find_tool("etcd"),
        "--name=default",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=default={peer_url}",
        "--initial-cluster-state=new",
        f"--enable-v2={'true' if enable_v2 else 'false'}",
        "--log-level=warn",
        "--logger=zap",
    ]
    proc = _popen(cmd, log)

    def healthy() -> bool:
        status, body = http_get(f"{client_url}/health")
        return status == 200 and json.loads(body).get("health") == "true"

    def fail(msg: str) -> Exception:
        stop_process(proc)
        return DevClusterError(f"etcd {msg}\n--- tail of {log} ---\n{log_tail(log)}")

    wait_until(healthy, timeout=timeout, what="etcd", alive=lambda: proc.poll() is None, on_fail=fail)
    return proc, client_url


def stop_process(proc: subprocess.Popen, term_timeout: float = 15.0) -> None:
    """SIGTERM a process started here (its whole session), SIGKILL after a bounded wait, reap it."""
    stop_pid({"pid": proc.pid, "start": None}, proc=proc, term_timeout=term_timeout)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _kubeconfig(server: str, ca_pem: bytes, user: str, auth: dict) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": CLUSTER_NAME, "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)}}
        ],
        "users": [{"name": user, "user": auth}],
        "contexts": [{"name": f"{user}@{CLUSTER_NAME}", "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": f"{user}@{CLUSTER_NAME}",
        "preferences": {},
    }


def _write_yaml(path: Path, doc: dict, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.chmod(mode)
    os.replace(tmp, path)
    return path


def _load_crd(item: dict | Path | str) -> list[dict]:
    if isinstance(item, dict):
        return [item]
    docs = [d for d in yaml.safe_load_all(Path(item).read_text()) if d]
    return [d for d in docs if d.get("kind") == "CustomResourceDefinition"]


class DevCluster:
    """A local control plane rooted at ``state_dir``.

    >>> c = DevCluster(".dev-cluster").up()   # doctest: +SKIP
    >>> c.kubectl("get", "ns").stdout          # doctest: +SKIP
    >>> c.down()                               # doctest: +SKIP
    """

    def __init__(
        self,
        state_dir: Path | str,
        *,
        verbosity: int = 1,
        chain: bool | None = None,
        nodes: dict[str, int] | None = None,
        training_operator_args: Sequence[str] = (),
    ):
        """``chain=True`` adds kube-scheduler, kwok nodes (``nodes``: ``{instance_type: count}``,
        default :data:`.chain.DEFAULT_NODES`, e.g. ``{"p5.48xlarge": 500}`` for a scale test) and
        the training-operator (``training_operator_args``: extra flags, e.g.
        ``["--controller-threads=4"]``; default: Kubeflow's own defaults, one worker thread and 20
        API QPS). ``chain=None``: whatever the cluster running from ``state_dir`` was started with
        (light when there is none)."""
        self.state_dir = Path(state_dir).resolve()
        self.verbosity = verbosity
        self._chain = chain
        self._nodes = nodes
        self.training_operator_args = list(training_operator_args)
        self._procs: dict[str, subprocess.Popen] = {}

    @property
    def chain(self) -> bool:
        if self._chain is not None:
            return self._chain
        return bool(self._info().get("chain"))

    @property
    def nodes(self) -> dict[str, int]:
        """The kwok nodes ``up()`` registers in chain mode."""
        return dict(self._nodes if self._nodes is not None else chain_mod.DEFAULT_NODES)

    @property
    def components(self) -> tuple[str, ...]:
        return _LIGHT + (_CHAIN if self.chain else ())

    # ----- paths ---------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def pki_dir(self) -> Path:
        return self.state_dir / "pki"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def _pids_file(self) -> Path:
        return self.state_dir / "pids.json"

    @property
    def _info_file(self) -> Path:
        return self.state_dir / "cluster.json"

    def _info(self) -> dict:
        try:
            return json.loads(self._info_file.read_text())
        except (OSError, ValueError):
            return {}

    @property
    def server(self) -> str:
        """The API server URL, e.g. ``https://127.0.0.1:40123``."""
        s = self._info().get("server")
        if not s:
            raise DevClusterError(f"no cluster state in {self.state_dir}; call up() first")
        return s

    @property
    def etcd_url(self) -> str:
        return self._info()["etcd"]

    # ----- lifecycle -----------------------------------------------------------------------
    def up(
        self,
        extra_crds: Iterable[dict | Path | str] = (),
        *,
        install_project_crd: bool = True,
        timeout: float = 180.0,
    ) -> "DevCluster":
        """Start etcd, kube-apiserver and kube-controller-manager; install CRDs; return self.

        Idempotent for a cluster that is already running from this ``state_dir``.
        On failure everything started is stopped and DevClusterError carries the log tail.
        """
        if self.is_running():
            self.install_crds(self._default_crds(install_project_crd) + list(extra_crds))
            return self
        self.down()  # stale pids from a crashed run
        for sub in ("etcd-data", "pki", "logs"):
            d = self.state_dir / sub
            if d.exists():
                _rmtree(d)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for f in (self._info_file, self._pids_file):
            f.unlink(missing_ok=True)
        try:
            self._start(timeout)
            self.install_crds(self._default_crds(install_project_crd) + list(extra_crds))
            if self.chain:
                self._start_chain(timeout)
        except BaseException:
            self.down()
            raise
        return self

    def _start(self, timeout: float) -> None:
        apiserver_bin = find_tool("kube-apiserver")
        cm_bin = find_tool("kube-controller-manager")
        find_tool("kubectl")
        self._write_pki()
        p = self.pki_dir

        etcd, etcd_url = start_etcd(
            self.state_dir / "etcd-data", enable_v2=True, log_path=self.logs_dir / "etcd.log",
            timeout=min(timeout, 60),
        )
        self._procs["etcd"] = etcd
        self._save_pids()

        api_port = free_port()
        server = f"https://127.0.0.1:{api_port}"
        self._info_file.write_text(json.dumps(
            {"server": server, "etcd": etcd_url, "chain": self.chain}, indent=2))
        self._write_kubeconfigs(server)
        api_cmd = [
            apiserver_bin,
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
            # No real nodes: don't try to publish 127.0.0.1 as the kubernetes service endpoint.
            "--endpoint-reconciler-type=none",
            # 1.35 serves resourceVersion=0 watches (kwok's, client-go's) as WatchList streams,
            # which etcd 3.4 cannot serve: they hang. Plain list+watch works everywhere.
            "--feature-gates=WatchList=false",
            # Otherwise every new Node gets node.kubernetes.io/not-ready:NoSchedule, which only
            # the node-lifecycle controller (off here: no kubelets) would remove.
            "--disable-admission-plugins=TaintNodesByCondition",
            "--allow-privileged=true",
            "--profiling=false",
            f"--v={self.verbosity}",
        ]
        api = _popen(api_cmd, self.logs_dir / "kube-apiserver.log")
        self._procs["kube-apiserver"] = api
        self._save_pids()
        ctx = self._admin_ssl_context()
        self._wait_ready(
            "kube-apiserver", api,
            lambda: http_get(f"{server}/readyz", context=ctx) == (200, "ok"),
            timeout,
        )

        cm_port = free_port()
        cm_kc = self.state_dir / "controller-manager.kubeconfig"
        cm_cmd = [
            cm_bin,
            f"--kubeconfig={cm_kc}",
            f"--authentication-kubeconfig={cm_kc}",
            f"--authorization-kubeconfig={cm_kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={cm_port}",
            f"--cert-dir={self.state_dir / 'controller-manager-certs'}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={p / 'sa.key'}",
            f"--root-ca-file={p / 'ca.crt'}",
            f"--cluster-signing-cert-file={p / 'ca.crt'}",
            f"--cluster-signing-key-file={p / 'ca.key'}",
            "--controllers=*," + ",".join(f"-{c}" for c in _DISABLED_CONTROLLERS),
            f"--v={self.verbosity}",
        ]
        cm = _popen(cm_cmd, self.logs_dir / "kube-controller-manager.log")
        self._procs["kube-controller-manager"] = cm
        self._save_pids()
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # its self-signed serving cert; loopback only
        self._wait_ready(
            "kube-controller-manager", cm,
            lambda: http_get(f"https://127.0.0.1:{cm_port}/healthz", context=insecure) == (200, "ok"),
            timeout,
        )
        info = self._info()
        info["controller_manager"] = f"https://127.0.0.1:{cm_port}"
        self._info_file.write_text(json.dumps(info, indent=2))

    def _wait_ready(self, name: str, proc: subprocess.Popen, check, timeout: float) -> None:
        log = self.logs_dir / f"{name}.log"

        def fail(msg: str) -> Exception:
            return DevClusterError(f"{name} {msg}\n--- tail of {log} ---\n{log_tail(log)}")

        wait_until(check, timeout=timeout, what=name, alive=lambda: proc.poll() is None, on_fail=fail)

    def _save_pids(self) -> None:
        write_pids(self._pids_file, {n: pid_record(p) for n, p in self._procs.items()})

    def down(self, term_timeout: float = 15.0) -> None:
        """Stop every component (SIGTERM, SIGKILL after ``term_timeout``); no process is left."""
        records = read_pids(self._pids_file)
        for name, proc in self._procs.items():
            records.setdefault(name, pid_record(proc))
        errors = []
        for name in _STOP_ORDER:
            rec = records.get(name)
            if not rec:
                continue
            proc = self._procs.get(name)
            if proc is not None and proc.pid != rec["pid"]:
                proc = None
            try:
                stop_pid(rec, proc=proc, term_timeout=term_timeout)
            except DevClusterError as e:
                errors.append(f"{name}: {e}")
        self._procs.clear()
        self._pids_file.unlink(missing_ok=True)
        if errors:
            raise DevClusterError("; ".join(errors))

    def pids(self) -> dict[str, int]:
        """Recorded component pids (whether or not they are still running)."""
        return {n: r["pid"] for n, r in read_pids(self._pids_file).items()}

    def is_running(self) -> bool:
        """All components of this mode are alive and the API server answers /readyz."""
        recs = read_pids(self._pids_file)
        if set(recs) != set(self.components) or not all(is_running(r) for r in recs.values()):
            return False
        try:
            return http_get(f"{self.server}/readyz", context=self._admin_ssl_context()) == (200, "ok")
        except (OSError, DevClusterError):
            return False

    def status(self) -> dict[str, Any]:
        recs = read_pids(self._pids_file)
        comps = {n: {"pid": r["pid"], "running": is_running(r)} for n, r in recs.items()}
        info = self._info()
        ready = False
        if info.get("server") and comps:
            try:
                ready = http_get(f"{info['server']}/readyz", context=self._admin_ssl_context()) == (200, "ok")
            except OSError:
                ready = False
        return {
            "state_dir": str(self.state_dir),
            "server": info.get("server"),
            "kubeconfig": str(self.kubeconfig),
            "components": comps,
            "ready": ready,
        }

    def __enter__(self) -> "DevCluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # ----- chain mode: kube-scheduler, training-operator, kwok nodes ------------------------
    def _start_chain(self, timeout: float) -> None:
        sched_bin = find_tool("kube-scheduler")
        to_bin = find_tool("training-operator")
        kwok_bin = find_tool("kwok")
        stages = kwok_stages_dir()
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # self-signed serving certs; loopback only
        info = self._info()

        port = free_port()
        kc = self.state_dir / "scheduler.kubeconfig"
        sched = _popen([
            sched_bin, f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}", "--bind-address=127.0.0.1", f"--secure-port={port}",
            "--leader-elect=false", f"--v={self.verbosity}",
        ], self.logs_dir / "kube-scheduler.log")
        self._procs["kube-scheduler"] = sched
        self._save_pids()
        self._wait_ready(
            "kube-scheduler", sched,
            lambda: http_get(f"https://127.0.0.1:{port}/healthz", context=insecure) == (200, "ok"),
            timeout,
        )
        info["scheduler"] = f"https://127.0.0.1:{port}"

        to_env, to_args = self.prepare_training_operator()
        probe, metrics, webhook = free_port(), free_port(), free_port()
        to = _popen([
            to_bin, "--enable-scheme=pytorchjob",
            f"--health-probe-bind-address=127.0.0.1:{probe}",
            f"--metrics-bind-address=127.0.0.1:{metrics}",
            # controller-runtime binds the webhook server on all interfaces; no flag for the host.
            f"--webhook-server-port={webhook}",
            *to_args, *self.training_operator_args,
        ], self.logs_dir / "training-operator.log", env=to_env)
        self._procs["training-operator"] = to
        self._save_pids()
        self._wait_ready(
            "training-operator", to,
            lambda: http_get(f"http://127.0.0.1:{probe}/readyz")[0] == 200,
            timeout,
        )
        info["training_operator_metrics"] = f"http://127.0.0.1:{metrics}/metrics"

        kwok_dir = self.state_dir / "kwok"
        kwok_dir.mkdir(parents=True, exist_ok=True)
        kport = free_port()
        cfg = kwok_dir / "kwok.yaml"
        cfg.write_text(chain_mod.kwok_config(stages, server_address=f"127.0.0.1:{kport}"))
        kwok_env = dict(os.environ, KWOK_WORKDIR=str(kwok_dir))  # no ~/.kwok config mixed in
        kw = _popen([kwok_bin, f"--kubeconfig={self.kubeconfig}", f"--config={cfg}"],
                    self.logs_dir / "kwok.log", env=kwok_env)
        self._procs["kwok"] = kw
        self._save_pids()
        self._wait_ready(
            "kwok", kw, lambda: http_get(f"http://127.0.0.1:{kport}/healthz")[0] == 200, timeout
        )
        info["kwok"] = f"http://127.0.0.1:{kport}"
        self._info_file.write_text(json.dumps(info, indent=2))
        self.add_nodes(self.nodes, timeout=timeout)

    def prepare_training_operator(self) -> tuple[dict, list[str]]:
        """What training-operator needs before it starts: its namespace, the (empty) Secret its
        cert rotator fills, and serving-cert files for its webhook server, kept in the state dir
        (TMPDIR points controller-runtime's default cert dir there). Returns (env, extra args)."""
        from kubernetes import client

        ns, secret = TRAINING_OPERATOR_NAMESPACE, TRAINING_OPERATOR_SECRET
        with self.api_client() as api:
            core = client.CoreV1Api(api)
            for create, body in (
                (lambda b: core.create_namespace(b), {"metadata": {"name": ns}}),
                (lambda b: core.create_namespaced_secret(ns, b), {"metadata": {"name": secret}}),
            ):
                try:
                    create(body)
                except client.ApiException as e:
                    if e.status != 409:
                        raise
        tmp = self.state_dir / "training-operator" / "tmp"
        certs = tmp / "k8s-webhook-server" / "serving-certs"
        certs.mkdir(parents=True, exist_ok=True)
        self._ca().issue_to_files(
            certs / "tls.crt", certs / "tls.key", "training-operator", server=True,
            dns=(f"training-operator.{ns}.svc", "localhost"), ips=("127.0.0.1",),
        )
        # The rotator stats this literal path (not TMPDIR's) before it reports ready; only the
        # public certificate goes there, and only when nothing is there yet.
        if not TRAINING_OPERATOR_ROTATOR_CERT.exists():
            TRAINING_OPERATOR_ROTATOR_CERT.parent.mkdir(parents=True, exist_ok=True)
            TRAINING_OPERATOR_ROTATOR_CERT.write_bytes((certs / "tls.crt").read_bytes())
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), TMPDIR=str(tmp),
                   MY_POD_NAMESPACE=ns)
        return env, []

    def add_nodes(self, shapes: dict[str, int], *, timeout: float = 120.0) -> list[str]:
        """Register kwok nodes ``{instance_type: count}`` (numbered after the existing ones of
        each type) and wait until kwok reports them Ready."""
        from kubernetes import client

        with self.api_client() as api:
            core = client.CoreV1Api(api)
            existing = core.list_node(label_selector="type=kwok").items
            start = {t: sum(1 for n in existing
                            if n.metadata.labels.get(chain_mod.INSTANCE_TYPE_LABEL) == t)
                     for t in shapes}
            names = []
            for node in chain_mod.node_manifests(shapes, start):
                core.create_node(node)
                names.append(node["metadata"]["name"])

            def ready() -> bool:  # one LIST per poll, not one GET per node (hundreds at scale)
                ok = {n.metadata.name for n in core.list_node(label_selector="type=kwok").items
                      if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])}
                return ok.issuperset(names)

            def fail(msg: str) -> Exception:
                log = self.logs_dir / "kwok.log"
                return DevClusterError(f"kwok nodes {msg}\n--- tail of {log} ---\n{log_tail(log)}")

            wait_until(ready, timeout=timeout, what=f"{len(names)} kwok nodes Ready", on_fail=fail)
        return names

    # ----- PKI / kubeconfigs ---------------------------------------------------------------
    def _write_pki(self) -> None:
        p = self.pki_dir
        ca = pki.CertificateAuthority.create()
        ca.save(p / "ca.crt", p / "ca.key")
        ca.issue_to_files(
            p / "apiserver.crt", p / "apiserver.key", "kube-apiserver", server=True,
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local"),
            ips=("127.0.0.1", SERVICE_IP),
        )
        ca.issue_to_files(p / "admin.crt", p / "admin.key", "kubernetes-admin",
                          orgs=("system:masters",), client=True)
        ca.issue_to_files(p / "controller-manager.crt", p / "controller-manager.key",
                          "system:kube-controller-manager", client=True)
        ca.issue_to_files(p / "scheduler.crt", p / "scheduler.key", "system:kube-scheduler", client=True)
        pki.write_service_account_keypair(p / "sa.key", p / "sa.pub")
        # Front-proxy (aggregation layer) CA: the controller-manager's delegated authentication
        # reads it from kube-system/extension-apiserver-authentication and errors without it.
        fp = pki.CertificateAuthority.create("llmtrain-dev-front-proxy-ca")
        fp.save(p / "front-proxy-ca.crt", p / "front-proxy-ca.key")
        fp.issue_to_files(p / "front-proxy-client.crt", p / "front-proxy-client.key",
                          "front-proxy-client", client=True)

    def _ca(self) -> pki.CertificateAuthority:
        return pki.CertificateAuthority.load(self.pki_dir / "ca.crt", self.pki_dir / "ca.key")

    def _cert_kubeconfig(self, path: Path, user: str, cert_pem: bytes, key_pem: bytes, server: str | None = None) -> Path:
        ca_pem = (self.pki_dir / "ca.crt").read_bytes()
        auth = {"client-certificate-data": _b64(cert_pem), "client-key-data": _b64(key_pem)}
        return _write_yaml(path, _kubeconfig(server or self.server, ca_pem, user, auth))

    def _write_kubeconfigs(self, server: str) -> None:
        p = self.pki_dir
        self._cert_kubeconfig(self.kubeconfig, "admin", (p / "admin.crt").read_bytes(),
                              (p / "admin.key").read_bytes(), server)
        self._cert_kubeconfig(self.state_dir / "controller-manager.kubeconfig",
                              "system:kube-controller-manager",
                              (p / "controller-manager.crt").read_bytes(),
                              (p / "controller-manager.key").read_bytes(), server)
        self._cert_kubeconfig(self.state_dir / "scheduler.kubeconfig", "system:kube-scheduler",
                              (p / "scheduler.crt").read_bytes(), (p / "scheduler.key").read_bytes(),
                              server)

    def _admin_ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
        ctx.load_cert_chain(str(self.pki_dir / "admin.crt"), str(self.pki_dir / "admin.key"))
        return ctx

    def make_user_kubeconfig(
        self, user: str, groups: Sequence[str] = (), path: Path | str | None = None
    ) -> Path:
        """A kubeconfig authenticating as ``user`` in ``groups`` (client cert signed by the CA).

        No RBAC bindings are created: the identity starts with only what system:authenticated has.
        """
        cert, key = self._ca().issue(user, orgs=tuple(groups), client=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in user)
        out = Path(path) if path else self.state_dir / "users" / f"{safe}.kubeconfig"
        return self._cert_kubeconfig(out, user, cert, key)

    def serviceaccount_kubeconfig(
        self,
        namespace: str,
        name: str,
        *,
        create: bool = False,
        expiration_seconds: int = 3600,
        path: Path | str | None = None,
    ) -> Path:
        """A kubeconfig using a bound token for ServiceAccount ``namespace/name`` (TokenRequest API).

        With ``create=True`` the ServiceAccount is created if missing.
        """
        from kubernetes import client

        with self.api_client() as api:
            core = client.CoreV1Api(api)
            if create:
                try:
                    core.create_namespaced_service_account(
                        namespace, {"metadata": {"name": name}}
                    )
                except client.ApiException as e:
                    if e.status != 409:
                        raise
            tr = core.create_namespaced_service_account_token(
                name, namespace,
                {"spec": {"expirationSeconds": expiration_seconds, "audiences": [SA_ISSUER]}},
            )
            token = tr.status.token
        ca_pem = (self.pki_dir / "ca.crt").read_bytes()
        user = f"system:serviceaccount:{namespace}:{name}"
        out = Path(path) if path else self.state_dir / "users" / f"sa-{namespace}-{name}.kubeconfig"
        return _write_yaml(out, _kubeconfig(self.server, ca_pem, user, {"token": token}))

    # ----- clients -------------------------------------------------------------------------
    def api_client(self, kubeconfig: Path | str | None = None):
        """A ``kubernetes.client.ApiClient`` for the admin (or the given) kubeconfig."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        kubeconfig: Path | str | None = None,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess:
        """Run the pinned kubectl against this cluster (admin unless ``kubeconfig`` is given)."""
        cmd = [str(find_tool("kubectl")), f"--kubeconfig={kubeconfig or self.kubeconfig}", *map(str, args)]
        r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise KubectlError(r.returncode, cmd, r.stdout, r.stderr)
        return r

    def helm(
        self,
        *args: str,
        check: bool = True,
        kubeconfig: Path | str | None = None,
        timeout: float = 300.0,
    ) -> subprocess.CompletedProcess:
        """Run the pinned helm against this cluster, with helm's state kept in ``state_dir``."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(kubeconfig or self.kubeconfig)
        for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"), ("HELM_DATA_HOME", "data")):
            env[var] = str(self.state_dir / "helm" / sub)
        cmd = [str(find_tool("helm")), *map(str, args)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        if check and r.returncode != 0:
            raise KubectlError(r.returncode, cmd, r.stdout, r.stderr)
        return r

    # ----- CRDs ----------------------------------------------------------------------------
    def _default_crds(self, install_project_crd: bool) -> list[dict | Path]:
        crds: list[dict | Path] = [pytorchjob_crd_path()]
        if install_project_crd:
            manifest = project_crd_manifest()
            if manifest is not None:
                crds.append(manifest)
        return crds

    def install_crds(self, crds: Iterable[dict | Path | str], timeout: float = 60.0) -> list[str]:
        """Create or update each CRD (dicts or YAML files) and wait until it is Established.

        Server-side apply through the pinned kubectl: large CRDs (Kubeflow's is ~8k lines) don't
        fit client-side apply's last-applied annotation, and the API server does all validation.
        """
        docs = [d for item in crds for d in _load_crd(item)]
        names = []
        for doc in docs:
            name = doc["metadata"]["name"]
            names.append(name)
            r = self.kubectl("apply", "--server-side", "--force-conflicts",
                             "--field-manager=llmtrain-devcluster", "-f", "-",
                             input=json.dumps(doc), check=False)
            if r.returncode != 0:
                raise DevClusterError(f"CRD {name} was rejected by the API server:\n{r.stderr.strip()}")
        ctx = self._admin_ssl_context()
        for name in names:
            url = f"{self.server}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"

            def established(url=url) -> bool:
                status, body = http_get(url, context=ctx)
                if status != 200:
                    return False
                conds = (json.loads(body).get("status") or {}).get("conditions") or []
                return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

            wait_until(established, timeout=timeout, what=f"CRD {name} Established")
        return names


def project_crd_manifest() -> dict | None:
    """``llmtrain.crd.crd_manifest()`` if that module exists yet, else None (with a note)."""
    try:
        mod = importlib.import_module("llmtrain.crd")
    except ModuleNotFoundError as e:
        if e.name not in ("llmtrain.crd", "llmtrain"):
            raise
        _note("llmtrain.crd is not importable yet: skipping the project's own CRD")
        return None
    fn = getattr(mod, "crd_manifest", None)
    if fn is None:
        _note("llmtrain.crd has no crd_manifest(): skipping the project's own CRD")
        return None
    return fn()


_noted: set[str] = set()


def _note(msg: str) -> None:
    if msg not in _noted:
        _noted.add(msg)
        import sys

        print(f"llmtrain_devcluster: {msg}", file=sys.stderr)


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)

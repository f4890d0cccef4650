"""A real local Kubernetes control plane: etcd + kube-apiserver + kube-controller-manager.

Everything listens on free 127.0.0.1 ports, uses certificates generated into ``state_dir``,
runs with ``--authorization-mode=Node,RBAC`` and a controller-manager that runs the garbage
collector, namespace, service-account and token controllers. In the light mode (default) there
are no nodes: pods stay Pending, which is what operator/chart tests need (objects, RBAC, GC, CRD
validation). ``chain=True`` adds kube-scheduler, kwok-simulated GPU nodes, the Kubeflow
training-operator and the JobSet controller (see :mod:`.chain`, :mod:`.jobset`), so PyTorchJobs and
JobSets get real pods that are scheduled and run.

Readiness is always polled (``/health``, ``/readyz``, ``/healthz``), never slept for.

This module starts the control plane, decides the mode's components and keeps the state
directory; each part has its own module: :mod:`.supervisor` (the components' processes and their
pid file) on :mod:`.process` (starting, polling, stopping), :mod:`.chain_controllers` (starting the
chain on a running control plane), :mod:`.certs` and :mod:`.pki` (certificates),
:mod:`.kubeconfigs`, :mod:`.components` (every component's command line), :mod:`.etcd`,
:mod:`.training_operator` (its certificate workaround), :mod:`.jobset` and :mod:`.webhooks` (the
JobSet controller and its loopback-served webhooks), :mod:`.nodes` (kwok nodes),
:mod:`.crds` and :mod:`.kubectl` (the kubectl and helm wrappers).
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from . import certs, chain_controllers, components, kubeconfigs, nodes, pki, training_operator
from . import chain as chain_mod
from . import jobset as jobset_mod
from . import kueue as kueue_mod
from .crds import default_crds, install_crds, project_crd_manifest
from .etcd import start_etcd
from .kubectl import KubectlError, run_helm, run_kubectl
from .node import lifecycle as node_mod
from .process import DevClusterError, free_port, http_get, stop_process
from .supervisor import Supervisor
from .tools import find_tool, refuse_in_unmarked_test

# start_etcd, stop_process, KubectlError and project_crd_manifest live in their own modules now;
# they stay importable from here.
__all__ = ["DevCluster", "KubectlError", "project_crd_manifest", "start_etcd", "stop_process"]

# Components start in this order and stop in reverse; the chain ones only with chain=True.
_LIGHT = ("etcd", "kube-apiserver", "kube-controller-manager")
_CHAIN = ("kube-scheduler", "training-operator", jobset_mod.NAME, "kwok")
_KUEUE = ("kueue",)  # with kueue=True (chain mode only)
_STOP_ORDER = tuple(reversed(_LIGHT + _CHAIN + _KUEUE))


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
        controller_manager_args: Sequence[str] = (),
        kueue: bool | None = None,
        kueue_topology: bool = False,
        kueue_frameworks: Sequence[str] = kueue_mod.CHAIN_FRAMEWORKS,
        real_node: bool | None = None,
    ):
        """``chain=True`` adds kube-scheduler, kwok nodes (``nodes``: ``{instance_type: count}``,
        default :data:`.chain.DEFAULT_NODES`, e.g. ``{"p5.48xlarge": 500}`` for a scale test), the
        JobSet controller and the training-operator (``training_operator_args``: extra flags, e.g.
        ``["--controller-threads=4"]``; default: Kubeflow's own defaults, one worker thread and 20
        API QPS; ``controller_manager_args``: extra kube-controller-manager flags, e.g.
        ``["--kube-api-qps=100"]``; default Kubernetes' own, 20 QPS per controller). ``chain=None``:
        whatever the cluster running from ``state_dir`` was started with
        (light when there is none). ``kueue=True`` (chain mode) also runs the pinned Kueue with
        its webhooks registered, queues generated from the nodes (see :mod:`.kueue`);
        ``kueue_topology=True`` makes its flavors topology-aware (the nodes' EKS network labels);
        ``kueue_frameworks``: its integrations (default both backends' kinds; e.g.
        :func:`.kueue.release_default_frameworks` for what a default install of the release enables).
        ``real_node=True`` (chain mode) also runs a real node beside the kwok ones: kubelet,
        containerd, a CNI bridge and CoreDNS on this machine (:mod:`.node`; needs root)."""
        self.state_dir = Path(state_dir).resolve()
        self.verbosity = verbosity
        self._chain = chain
        self._kueue = kueue
        self._real_node = real_node
        self.kueue_topology = kueue_topology
        self.kueue_frameworks = tuple(kueue_frameworks)
        self._nodes = nodes
        self.training_operator_args = list(training_operator_args)
        self.controller_manager_args = list(controller_manager_args)
        self.processes = Supervisor(self._pids_file, self.logs_dir)

    @property
    def _procs(self) -> dict[str, subprocess.Popen]:
        """The components this object started (``bench/`` reads their pids for CPU accounting)."""
        return self.processes.procs

    @property
    def chain(self) -> bool:
        if self._chain is not None:
            return self._chain
        return bool(self._info().get("chain"))

    @property
    def kueue(self) -> bool:
        if self._kueue is not None:
            return self._kueue and self.chain
        return bool(self._info().get("kueue"))

    @property
    def real_node(self) -> bool:
        if self._real_node is not None:
            return self._real_node
        return bool(self._info().get("real_node"))

    @property
    def nodes(self) -> dict[str, int]:
        """The kwok nodes ``up()`` registers in chain mode."""
        return dict(self._nodes if self._nodes is not None else chain_mod.DEFAULT_NODES)

    @property
    def components(self) -> tuple[str, ...]:
        return _LIGHT + (_CHAIN if self.chain else ()) + (_KUEUE if self.kueue else ())

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

    def update_info(self, **fields: Any) -> None:
        """Add ``fields`` to ``cluster.json`` (a started component's endpoints)."""
        self._info_file.write_text(json.dumps({**self._info(), **fields}, indent=2))

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
    ) -> DevCluster:
        """Start etcd, kube-apiserver and kube-controller-manager; install CRDs; return self.

        Idempotent for a cluster that is already running from this ``state_dir``.
        On failure everything started is stopped and DevClusterError carries the log tail.
        """
        refuse_in_unmarked_test("cluster", "a dev cluster")
        if self.real_node and not self.chain:
            raise DevClusterError(
                "a real node needs chain mode (--chain): light mode runs no kube-scheduler to bind its pods"
            )
        if self.is_running():
            self.install_crds(default_crds(install_project_crd) + list(extra_crds))
            return self
        self.down()  # stale pids from a crashed run
        for sub in ("etcd-data", "pki", "logs"):
            d = self.state_dir / sub
            if d.exists():
                shutil.rmtree(d, ignore_errors=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for f in (self._info_file, self._pids_file):
            f.unlink(missing_ok=True)
        try:
            self._start(timeout)
            self.install_crds(default_crds(install_project_crd) + list(extra_crds))
            if self.chain:
                chain_controllers.start(self, timeout)
            if self.real_node:
                node_mod.start(self, timeout=timeout, verbosity=self.verbosity)
        except BaseException:
            self.down()
            raise
        return self

    def _start(self, timeout: float) -> None:
        apiserver_bin = find_tool("kube-apiserver")
        cm_bin = find_tool("kube-controller-manager")
        find_tool("kubectl")
        certs.write_cluster_pki(self.pki_dir)
        p = self.pki_dir

        etcd, etcd_url = start_etcd(
            self.state_dir / "etcd-data",
            enable_v2=True,
            log_path=self.logs_dir / "etcd.log",
            timeout=min(timeout, 60),
        )
        self.processes.adopt("etcd", etcd)

        api_port = free_port()
        server = f"https://127.0.0.1:{api_port}"
        self._info_file.write_text(
            json.dumps(
                {
                    "server": server,
                    "etcd": etcd_url,
                    "chain": self.chain,
                    "kueue": self.kueue,
                    "real_node": self.real_node,
                },
                indent=2,
            )
        )
        kubeconfigs.write_component_kubeconfigs(self.state_dir, p, server)
        ctx = self._admin_ssl_context()
        self.processes.start(
            "kube-apiserver",
            components.apiserver_argv(
                apiserver_bin,
                etcd_url=etcd_url,
                port=api_port,
                pki=p,
                verbosity=self.verbosity,
                kubelet_client=self.real_node,
            ),
            lambda: http_get(f"{server}/readyz", context=ctx) == (200, "ok"),
            timeout,
        )

        cm_port = free_port()
        insecure = certs.insecure_ssl_context()  # its self-signed serving cert
        self.processes.start(
            "kube-controller-manager",
            components.controller_manager_argv(
                cm_bin,
                kubeconfig=self.state_dir / "controller-manager.kubeconfig",
                port=cm_port,
                cert_dir=self.state_dir / "controller-manager-certs",
                pki=p,
                verbosity=self.verbosity,
                extra=self.controller_manager_args,
            ),
            lambda: http_get(f"https://127.0.0.1:{cm_port}/healthz", context=insecure) == (200, "ok"),
            timeout,
        )
        self.update_info(controller_manager=f"https://127.0.0.1:{cm_port}")

    def down(self, term_timeout: float = 15.0) -> None:
        """Stop every component (SIGTERM, SIGKILL after ``term_timeout``); no process is left.
        The real node goes first, with everything it made (:func:`.node.lifecycle.down`)."""
        errors = [f"real node: {p}" for p in node_mod.down(self.state_dir)]
        errors += self.processes.stop(_STOP_ORDER, term_timeout)
        if errors:
            raise DevClusterError("; ".join(errors))

    def pids(self) -> dict[str, int]:
        """Recorded component pids (whether or not they are still running)."""
        return {n: r["pid"] for n, r in self.processes.records().items()}

    def is_running(self) -> bool:
        """All components of this mode are alive and the API server answers /readyz."""
        if not self.processes.all_running(self.components):
            return False
        if self.real_node:
            procs = node_mod.status(self.state_dir).get("processes", {})
            if not procs or not all(p["running"] for p in procs.values()):
                return False
        try:
            return http_get(f"{self.server}/readyz", context=self._admin_ssl_context()) == (200, "ok")
        except (OSError, DevClusterError):
            return False

    def status(self) -> dict[str, Any]:
        comps = self.processes.states()
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
            "real_node": node_mod.status(self.state_dir) or None,
        }

    def __enter__(self) -> DevCluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ----- chain mode: what its controllers (:mod:`.chain_controllers`) ask of the cluster ---------
    def kueue_local_queue(self, namespace: str, name: str = "default") -> None:
        """A LocalQueue ``name`` in ``namespace`` on the dev cluster's ClusterQueue."""
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(kueue_mod.local_queue(namespace, name)))

    def prepare_training_operator(self) -> tuple[dict, list[str]]:
        """What training-operator needs before it starts (see :mod:`.training_operator`).
        Returns (env, extra args)."""
        with self.api_client() as api:
            env = training_operator.prepare(api, state_dir=self.state_dir, kubeconfig=self.kubeconfig, ca=self._ca())
        return env, []

    def add_nodes(self, shapes: dict[str, int], *, timeout: float = 120.0) -> list[str]:
        """Register kwok nodes ``{instance_type: count}`` (numbered after the existing ones of
        each type) and wait until kwok reports them Ready."""
        with self.api_client() as api:
            return nodes.add_nodes(api, shapes, timeout=timeout, kwok_log=self.logs_dir / "kwok.log")

    # ----- certificates / kubeconfigs --------------------------------------------------------
    def _ca(self) -> pki.CertificateAuthority:
        return certs.load_ca(self.pki_dir)

    def _admin_ssl_context(self) -> ssl.SSLContext:
        return certs.admin_ssl_context(self.pki_dir)

    def make_user_kubeconfig(self, user: str, groups: Sequence[str] = (), path: Path | str | None = None) -> Path:
        """A kubeconfig authenticating as ``user`` in ``groups`` (client cert signed by the CA).

        No RBAC bindings are created: the identity starts with only what system:authenticated has.
        """
        cert, key = self._ca().issue(user, orgs=tuple(groups), client=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in user)
        out = Path(path) if path else self.state_dir / "users" / f"{safe}.kubeconfig"
        return kubeconfigs.write_cert_kubeconfig(
            out,
            server=self.server,
            ca_pem=(self.pki_dir / "ca.crt").read_bytes(),
            user=user,
            cert_pem=cert,
            key_pem=key,
        )

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
                    core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
                except client.ApiException as e:
                    if e.status != 409:
                        raise
            tr = core.create_namespaced_service_account_token(
                name,
                namespace,
                {"spec": {"expirationSeconds": expiration_seconds, "audiences": [components.SA_ISSUER]}},
            )
            token = tr.status.token
        user = f"system:serviceaccount:{namespace}:{name}"
        out = Path(path) if path else self.state_dir / "users" / f"sa-{namespace}-{name}.kubeconfig"
        return kubeconfigs.write_token_kubeconfig(
            out, server=self.server, ca_pem=(self.pki_dir / "ca.crt").read_bytes(), user=user, token=token
        )

    # ----- clients -------------------------------------------------------------------------
    def api_client(self, kubeconfig: Path | str | None = None) -> Any:
        """A ``kubernetes.client.ApiClient`` for the admin (or the given) kubeconfig.

        The admin's reads its certificates from ``pki/``; a kubeconfig's embedded ones would be
        copied to temporary files outside the state dir by the kubernetes client."""
        from kubernetes import client, config

        if kubeconfig is not None:
            return config.new_client_from_config(config_file=str(kubeconfig))
        cfg = client.Configuration()
        cfg.host = self.server
        cfg.ssl_ca_cert = str(self.pki_dir / "ca.crt")
        cfg.cert_file = str(self.pki_dir / "admin.crt")
        cfg.key_file = str(self.pki_dir / "admin.key")
        return client.ApiClient(cfg)

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        kubeconfig: Path | str | None = None,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess:
        """Run the pinned kubectl against this cluster (admin unless ``kubeconfig`` is given)."""
        return run_kubectl(kubeconfig or self.kubeconfig, *args, check=check, input=input, timeout=timeout)

    def helm(
        self,
        *args: str,
        check: bool = True,
        kubeconfig: Path | str | None = None,
        timeout: float = 300.0,
    ) -> subprocess.CompletedProcess:
        """Run the pinned helm against this cluster, with helm's state kept in ``state_dir``."""
        return run_helm(kubeconfig or self.kubeconfig, self.state_dir / "helm", *args, check=check, timeout=timeout)

    def apply(self, docs: Iterable[dict]) -> None:
        """Create or update each object (server-side apply, as the dev cluster's own field
        manager); DevClusterError names the one the API server rejected, with its reason."""
        for doc in docs:
            r = self.kubectl(
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=llmtrain-devcluster",
                "-f",
                "-",
                input=json.dumps(doc),
                check=False,
            )
            if r.returncode != 0:
                raise DevClusterError(f"{doc['kind']} {doc['metadata']['name']} was rejected:\n{r.stderr.strip()}")

    # ----- CRDs ----------------------------------------------------------------------------
    def install_crds(self, crds: Iterable[dict | Path | str], timeout: float = 60.0) -> list[str]:
        """Create or update each CRD (dicts or YAML files) and wait until it is Established
        (see :func:`.crds.install_crds`)."""
        return install_crds(
            crds, apply=self.apply, server=self.server, context=self._admin_ssl_context(), timeout=timeout
        )

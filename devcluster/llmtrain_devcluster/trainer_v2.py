"""Kubeflow Trainer v2 (TrainJob → JobSet → Jobs → pods) on a running dev cluster: the peer that
``bench/operator_scale.py --peer`` measures llmtrain against, on the same API server.

Two real controllers, built from their Go modules by ``scripts/install-peer-tools.sh`` (``make
peer-tools``) into a cache of their own (``${LLMTRAIN_CACHE}/peer-tools/<key>``, not the dev-cluster
tools key):

* the JobSet controller (``sigs.k8s.io/jobset``, the version Trainer's go.mod requires);
* the Trainer controller manager (``github.com/kubeflow/trainer/v2``).

Their CRDs and admission webhooks are the modules' own manifests, with the modules' own kustomize
patches applied; each webhook is really served: its ``clientConfig`` points at the controller's
loopback port with the dev cluster's CA as ``caBundle``, and the controller serves a certificate that
CA issued (the in-process cert rotators are off: no Service, no Secret to rotate). Nothing here is
on ``make test``'s default path.

    with TrainerV2(cluster) as peer:      # cluster: a started chain DevCluster
        peer.install_runtime(runtime)     # a ClusterTrainingRuntime dict
        ...                               # create TrainJobs
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from . import pki
from .certs import load_ca
from .process import (
    DevClusterError,
    free_port,
    http_get,
    pid_record,
    read_pids,
    spawn,
    stop_pid,
    stop_process,
    wait_ready,
    write_pids,
)
from .tools import ToolNotFoundError, cache_dir

if TYPE_CHECKING:
    import subprocess

    from .cluster import DevCluster

__all__ = ["TrainerV2", "apply_json_patch", "peer_tools_dir", "stop_recorded", "webhook_configurations"]

TRAINJOB = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
CLUSTER_TRAINING_RUNTIME = ("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes")
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"

# Same files, same order as KEY_FILES in scripts/install-peer-tools.sh.
_KEY_FILES = ("trainer/go.mod", "trainer/go.sum", "jobset/go.mod", "jobset/go.sum")
_HINT = "run `make peer-tools` (scripts/install-peer-tools.sh) first"

# The modules' own webhook manifests and the kustomize JSON patches their release applies.
_TRAINER_WEBHOOK = (
    "trainer/webhook/manifests.yaml",
    {
        "MutatingWebhookConfiguration": "trainer/webhook/patch_mutating.yaml",
        "ValidatingWebhookConfiguration": "trainer/webhook/patch_validating.yaml",
    },
)
_JOBSET_WEBHOOK = (
    "jobset/webhook/manifests.yaml",
    {
        "MutatingWebhookConfiguration": "jobset/webhook/patches/mutating-patch.yaml",
        "ValidatingWebhookConfiguration": "jobset/webhook/patches/validating-patch.yaml",
    },
)
_TRAINER_CRDS = (
    "trainer/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml",
    "trainer/crds/trainer.kubeflow.org_trainingruntimes.yaml",
    "trainer/crds/trainer.kubeflow.org_trainjobs.yaml",
)
_JOBSET_CRDS = ("jobset/crd/bases/jobset.x-k8s.io_jobsets.yaml",)


def peer_tools_key(tools_root: Path | None = None) -> str:
    root = tools_root or Path(__file__).resolve().parents[2] / "tools"
    h = hashlib.sha256()
    for f in _KEY_FILES:
        h.update((root / f).read_bytes())
    return h.hexdigest()[:16]


def peer_tools_dir() -> Path:
    """``${LLMTRAIN_CACHE}/peer-tools/<key>`` for this checkout's pins (``LLMTRAIN_PEER_TOOLS_DIR``
    overrides it)."""
    env = os.environ.get("LLMTRAIN_PEER_TOOLS_DIR")
    d = Path(env) if env else cache_dir() / "peer-tools" / peer_tools_key()
    for need in ("bin/trainer-controller-manager", "bin/jobset-controller", "trainer/.complete", "jobset/.complete"):
        if not (d / need).exists():
            raise ToolNotFoundError(f"Kubeflow Trainer v2 / JobSet: {d / need} not found; {_HINT}")
    return d


def apply_json_patch(doc: Any, ops: list[dict]) -> Any:
    """The ``add``/``replace``/``remove`` operations of an RFC 6902 patch (what kustomize's
    patches in these modules use), applied in place to ``doc``; returns ``doc``."""
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        kind = op["op"]
        if isinstance(parent, list):
            i = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(i, op["value"])
            elif kind == "replace":
                parent[i] = op["value"]
            elif kind == "remove":
                del parent[i]
            else:
                raise ValueError(f"JSON patch op {kind!r} at {op['path']} is not supported")
        elif kind in ("add", "replace"):
            if kind == "replace" and last not in parent:
                raise ValueError(f"JSON patch: replace of missing {op['path']}")
            parent[last] = op["value"]
        elif kind == "remove":
            del parent[last]
        else:
            raise ValueError(f"JSON patch op {kind!r} at {op['path']} is not supported")
    return doc


def webhook_configurations(root: Path, spec: tuple[str, dict[str, str]], url: str, ca_pem: bytes) -> list[dict]:
    """A module's webhook configurations with its release patches applied, each ``clientConfig``
    the loopback ``url`` (+ the webhook's own path) and ``caBundle`` ``ca_pem``."""
    import base64

    manifest, patches = spec
    out = []
    for doc in yaml.safe_load_all((root / manifest).read_text()):
        if not doc:
            continue
        patch = patches.get(doc["kind"])
        if patch:
            apply_json_patch(doc, yaml.safe_load((root / patch).read_text()))
        for hook in doc["webhooks"]:
            service = hook["clientConfig"].pop("service")
            hook["clientConfig"] = {"url": url + service["path"], "caBundle": base64.b64encode(ca_pem).decode()}
        out.append(doc)
    return out


class TrainerV2:
    """The JobSet controller and the Trainer v2 controller manager, started on ``cluster`` (a
    running :class:`DevCluster`) with the modules' default concurrency and client QPS; their CRDs
    and webhooks installed. ``pids`` maps ``jobset-controller`` and ``trainer-controller-manager``
    to their process ids (for CPU accounting). ``stop()`` leaves no process behind."""

    NAMES = ("jobset-controller", "trainer-controller-manager")

    def __init__(self, cluster: DevCluster, *, log_level: str = "info"):
        self.cluster = cluster
        # Both log at info in production (JSON) mode: the releases ship debug levels (JobSet's
        # --zap-devel default, the Trainer's --zap-log-level=2), whose logging would be measured as
        # controller CPU.
        self.log_level = log_level
        self.root = peer_tools_dir()
        self.state = cluster.state_dir / "trainer-v2"
        self._procs: dict[str, subprocess.Popen] = {}

    @property
    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self._procs.items()}

    def versions(self) -> str:
        return (self.root / "VERSIONS").read_text()

    # ----- lifecycle ---------------------------------------------------------------------
    def start(self, timeout: float = 180.0) -> TrainerV2:
        try:
            self.cluster.install_crds([self.root / f for f in _JOBSET_CRDS + _TRAINER_CRDS])
            ca = load_ca(self.cluster.pki_dir)
            # JobSet first: the Trainer's TrainJob reconciler creates JobSets, which JobSet's webhooks admit.
            port = self._start("jobset-controller", ca, self._jobset_config, timeout)
            self._apply(webhook_configurations(self.root, _JOBSET_WEBHOOK, f"https://127.0.0.1:{port}", ca.cert_pem))
            port = self._start("trainer-controller-manager", ca, self._trainer_config, timeout)
            self._apply(webhook_configurations(self.root, _TRAINER_WEBHOOK, f"https://127.0.0.1:{port}", ca.cert_pem))
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, name: str, ca: pki.CertificateAuthority, make_config, timeout: float) -> int:
        d = self.state / name
        tmp = d / "tmp"
        certs = tmp / "k8s-webhook-server" / "serving-certs"  # controller-runtime's default cert dir
        certs.mkdir(parents=True, exist_ok=True)
        ca.issue_to_files(
            certs / "tls.crt", certs / "tls.key", name, server=True, dns=("localhost",), ips=("127.0.0.1",)
        )
        probe, webhook = free_port(), free_port()
        cfg = d / "config.yaml"
        cfg.write_text(yaml.safe_dump(make_config(probe, webhook, str(certs)), sort_keys=False))
        binary = self.root / "bin" / name
        cmd = [str(binary), f"--config={cfg}", f"--zap-log-level={self.log_level}", "--zap-devel=false"]
        if name == "jobset-controller":  # its flags override the file's for these two
            cmd += [f"--health-probe-bind-address=127.0.0.1:{probe}", "--metrics-bind-address=0"]
        log = self.cluster.logs_dir / f"{name}.log"
        env = dict(os.environ, KUBECONFIG=str(self.cluster.kubeconfig), TMPDIR=str(tmp))
        proc = spawn(cmd, log, env=env)
        self._procs[name] = proc
        write_pids(self.state / "pids.json", {n: pid_record(p) for n, p in self._procs.items()})
        wait_ready(name, proc, lambda: http_get(f"http://127.0.0.1:{probe}/readyz")[0] == 200, timeout=timeout, log=log)
        return webhook

    def _jobset_config(self, probe: int, webhook: int, cert_dir: str) -> dict:
        # Upstream's config (config/components/manager) less leader election and the cert rotator.
        return {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{probe}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"port": webhook, "host": "127.0.0.1", "certDir": cert_dir},
        }

    def _trainer_config(self, probe: int, webhook: int, cert_dir: str) -> dict:
        # Upstream's shipped config (manifests/base/manager), loopback addresses, no leader election,
        # no cert rotator; its controller concurrency and client QPS/burst are kept as released.
        cfg = yaml.safe_load((self.root / "trainer/manager/controller_manager_config.yaml").read_text())
        cfg["health"]["healthProbeBindAddress"] = f"127.0.0.1:{probe}"
        cfg["metrics"] = {"bindAddress": "0"}
        cfg["webhook"] = {"port": webhook, "host": "127.0.0.1"}
        cfg["leaderElection"] = {"leaderElect": False}
        cfg["certManagement"] = {"enable": False}
        return cfg

    def _apply(self, docs: list[dict]) -> None:
        for doc in docs:
            r = self.cluster.kubectl(
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

    def install_runtime(self, runtime: dict) -> None:
        """Create or update a ClusterTrainingRuntime (admitted by the Trainer's own webhook)."""
        self._apply([runtime])

    def upstream_torch_runtime(self) -> dict:
        """The release's own ``torch-distributed`` ClusterTrainingRuntime (manifests/base/runtimes)."""
        return yaml.safe_load((self.root / "trainer/runtimes/torch_distributed.yaml").read_text())

    def stop(self) -> None:
        errors = []
        for name in reversed(list(self._procs)):
            proc = self._procs.pop(name)
            try:
                stop_process(proc)
            except DevClusterError as e:
                errors.append(f"{name}: {e}")
        (self.state / "pids.json").unlink(missing_ok=True)
        if errors:
            raise DevClusterError("; ".join(errors))

    def __enter__(self) -> TrainerV2:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_recorded(state_dir: Path | str) -> int:
    """Stop the controllers a :class:`TrainerV2` started from another process (``python -m
    llmtrain_devcluster up --trainer-v2``), from the pids it recorded; returns how many there were."""
    pids_file = Path(state_dir).resolve() / "trainer-v2" / "pids.json"
    records = read_pids(pids_file)
    for name in reversed(TrainerV2.NAMES):
        if name in records:
            stop_pid(records[name])
    pids_file.unlink(missing_ok=True)
    return len(records)

"""Kubeflow Trainer v2 (TrainJob → JobSet → Jobs → pods) on a running chain dev cluster: the peer
that ``bench/operator_scale.py --peer`` measures llmtrain against, on the same API server.

The Trainer controller manager (``github.com/kubeflow/trainer/v2``) is built from its Go module by
``scripts/install-peer-tools.sh`` (``make peer-tools``) into a cache of its own
(``${LLMTRAIN_CACHE}/peer-tools/<key>``, not the dev-cluster tools key). The JobSet controller it
renders into is the chain's own (:mod:`.jobset`, built by ``make tools``, at the version Trainer's
go.mod requires: the script checks the pair).

Its CRDs and admission webhooks are the module's own manifests, with the module's own kustomize
patches applied; each webhook is really served (:mod:`.webhooks`): its ``clientConfig`` points at
the controller's loopback port with the dev cluster's CA as ``caBundle``, and the controller serves
a certificate that CA issued (the in-process cert rotator is off: no Service, no Secret to rotate).
Nothing here is on ``make test``'s default path.

    with TrainerV2(cluster) as peer:      # cluster: a started chain DevCluster
        peer.install_runtime(runtime)     # a ClusterTrainingRuntime dict
        ...                               # create TrainJobs
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from . import jobset, pki
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
from .webhooks import module_webhook_configurations, write_serving_cert

if TYPE_CHECKING:
    import subprocess

    from .cluster import DevCluster

__all__ = ["TrainerV2", "peer_tools_dir", "stop_recorded", "trainer_webhook_configurations"]

TRAINJOB = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
CLUSTER_TRAINING_RUNTIME = ("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes")

# Same files, same order as KEY_FILES in scripts/install-peer-tools.sh.
_KEY_FILES = ("trainer/go.mod", "trainer/go.sum")
_HINT = "run `make peer-tools` (scripts/install-peer-tools.sh) first"

# The module's own webhook manifest and the kustomize JSON patches its release applies.
_TRAINER_WEBHOOK = "trainer/webhook/manifests.yaml"
_TRAINER_WEBHOOK_PATCHES = {
    "MutatingWebhookConfiguration": "trainer/webhook/patch_mutating.yaml",
    "ValidatingWebhookConfiguration": "trainer/webhook/patch_validating.yaml",
}
_TRAINER_CRDS = (
    "trainer/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml",
    "trainer/crds/trainer.kubeflow.org_trainingruntimes.yaml",
    "trainer/crds/trainer.kubeflow.org_trainjobs.yaml",
)


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
    for need in ("bin/trainer-controller-manager", "trainer/.complete"):
        if not (d / need).exists():
            raise ToolNotFoundError(f"Kubeflow Trainer v2: {d / need} not found; {_HINT}")
    return d


def trainer_webhook_configurations(root: Path, url: str, ca_pem: bytes) -> list[dict]:
    """The Trainer's webhook configurations (its release patches applied), calling ``url``."""
    return module_webhook_configurations(root, _TRAINER_WEBHOOK, _TRAINER_WEBHOOK_PATCHES, url, ca_pem)


class TrainerV2:
    """The Trainer v2 controller manager, started on ``cluster`` (a running chain
    :class:`DevCluster`, whose JobSet controller it renders into) with the module's default
    concurrency and client QPS; its CRDs and webhooks installed. ``pids`` maps
    ``trainer-controller-manager`` to its process id (for CPU accounting; the JobSet controller is
    among the cluster's). ``stop()`` leaves no process behind."""

    NAMES = ("trainer-controller-manager",)

    def __init__(self, cluster: DevCluster, *, log_level: str = "info"):
        self.cluster = cluster
        # Info level in production (JSON) mode: the release ships a debug level
        # (--zap-log-level=2), whose logging would be measured as controller CPU.
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
        if jobset.NAME not in self.cluster.pids():
            raise DevClusterError(
                f"Kubeflow Trainer v2 renders JobSets: it needs a chain dev cluster (its {jobset.NAME}); "
                f"{self.cluster.state_dir} runs {', '.join(self.cluster.pids()) or 'nothing'}"
            )
        try:
            self.cluster.install_crds([self.root / f for f in _TRAINER_CRDS])
            ca = load_ca(self.cluster.pki_dir)
            port = self._start("trainer-controller-manager", ca, timeout)
            self.cluster.apply(trainer_webhook_configurations(self.root, f"https://127.0.0.1:{port}", ca.cert_pem))
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, name: str, ca: pki.CertificateAuthority, timeout: float) -> int:
        d = self.state / name
        tmp = d / "tmp"
        # controller-runtime's default cert dir under TMPDIR: the Trainer's config has no certDir.
        write_serving_cert(ca, tmp / "k8s-webhook-server" / "serving-certs", name)
        probe, webhook = free_port(), free_port()
        cfg = d / "config.yaml"
        cfg.write_text(yaml.safe_dump(self._trainer_config(probe, webhook), sort_keys=False))
        binary = self.root / "bin" / name
        cmd = [str(binary), f"--config={cfg}", f"--zap-log-level={self.log_level}", "--zap-devel=false"]
        log = self.cluster.logs_dir / f"{name}.log"
        env = dict(os.environ, KUBECONFIG=str(self.cluster.kubeconfig), TMPDIR=str(tmp))
        proc = spawn(cmd, log, env=env)
        self._procs[name] = proc
        write_pids(self.state / "pids.json", {n: pid_record(p) for n, p in self._procs.items()})
        wait_ready(name, proc, lambda: http_get(f"http://127.0.0.1:{probe}/readyz")[0] == 200, timeout=timeout, log=log)
        return webhook

    def _trainer_config(self, probe: int, webhook: int) -> dict:
        # Upstream's shipped config (manifests/base/manager), loopback addresses, no leader election,
        # no cert rotator; its controller concurrency and client QPS/burst are kept as released.
        cfg = yaml.safe_load((self.root / "trainer/manager/controller_manager_config.yaml").read_text())
        cfg["health"]["healthProbeBindAddress"] = f"127.0.0.1:{probe}"
        cfg["metrics"] = {"bindAddress": "0"}
        cfg["webhook"] = {"port": webhook, "host": "127.0.0.1"}
        cfg["leaderElection"] = {"leaderElect": False}
        cfg["certManagement"] = {"enable": False}
        return cfg

    def install_runtime(self, runtime: dict) -> None:
        """Create or update a ClusterTrainingRuntime (admitted by the Trainer's own webhook)."""
        self.cluster.apply([runtime])

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

"""The JobSet controller (``sigs.k8s.io/jobset``) as the chain dev cluster runs it: a JobSet's
replicated Jobs, their headless Service, its failure and success policies, and its admission
webhooks, really served.

``make tools`` builds the controller from ``tools/k8s`` (JobSet at the version Kubeflow Trainer v2's
go.mod requires) and copies the module's CRD (every dev cluster, light or chain, installs it, as it does
the PyTorchJob CRD) and webhook manifests into the tools cache (:mod:`.tools`). In chain mode
:class:`~.cluster.DevCluster` starts it after the training-operator: the controller serves its
webhooks on a loopback port with a certificate the dev cluster's CA issued (its cert rotator is
off: no Service, no Secret), then the module's webhook configurations, with its release patches
(the pod webhooks only see pods that carry :data:`JOBSET_NAME_LABEL`), are registered pointing
there. Kubeflow Trainer v2 (:mod:`.trainer_v2`) uses this same controller.

This module holds what is JobSet's; starting and stopping it is the cluster's.
"""

from __future__ import annotations

from pathlib import Path

from .tools import jobset_webhook_dir
from .webhooks import module_webhook_configurations

__all__ = ["JOBSET", "JOBSET_NAME_LABEL", "NAME", "argv", "config", "webhook_configurations"]

NAME = "jobset-controller"
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
# The label JobSet puts on its Jobs and pods (and its pod webhooks select on).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"

# Under tools/<key>/jobset/webhook: the module's config/components/webhook files.
_MANIFEST = "manifests.yaml"
_PATCHES = {
    "MutatingWebhookConfiguration": "patches/mutating-patch.yaml",
    "ValidatingWebhookConfiguration": "patches/validating-patch.yaml",
}


def config(*, probe_port: int, webhook_port: int, cert_dir: Path) -> dict:
    """Upstream's Configuration (``config/components/manager``) less leader election and the cert
    rotator, everything on loopback, no metrics listener."""
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
    }


def argv(binary: Path, *, config_file: Path, probe_port: int, log_level: str = "info") -> list:
    """Its command line. The release ships ``--zap-devel`` (debug logging), whose cost the peer
    bench would measure as controller CPU: info level in production (JSON) mode here. Its flags
    override the file's probe and metrics addresses, so they are given again."""
    return [
        binary,
        f"--config={config_file}",
        f"--zap-log-level={log_level}",
        "--zap-devel=false",
        f"--health-probe-bind-address=127.0.0.1:{probe_port}",
        "--metrics-bind-address=0",
    ]


def webhook_configurations(url: str, ca_pem: bytes, webhook_dir: Path | None = None) -> list[dict]:
    """JobSet's webhook configurations (its release patches applied), calling ``url`` + each path
    with ``ca_pem`` as the bundle."""
    root = webhook_dir or jobset_webhook_dir()
    return module_webhook_configurations(root, _MANIFEST, _PATCHES, url, ca_pem)

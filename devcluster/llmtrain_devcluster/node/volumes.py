"""Persistent volumes on the real node: a directory of this machine as a ``local``
PersistentVolume with its claim, bound to each other (no provisioner runs), the way a cluster's FSx
or EBS volume reaches a job's pods through ``spec.cluster.volumes``. What survives a pod (a
checkpoint written before SIGTERM's grace period ends) is then there for the next attempt's pods.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..process import DevClusterError, wait_until
from .lifecycle import NODE_NAME

__all__ = ["STORAGE_CLASS", "local_volume"]

STORAGE_CLASS = "llmtrain-local"  # no StorageClass object: the claim names its volume


def local_volume(cluster: Any, namespace: str, name: str, path: Path | str, *, size: str = "1Gi") -> str:
    """Make ``path`` (created, writable by every UID: the pods run as the image's user and a
    ``local`` volume gets no fsGroup ownership) a PersistentVolume ``<namespace>-<name>`` on the real
    node and claim ``name`` in ``namespace`` bound to it; returns the claim's name once it is
    Bound. ``cluster``: a DevCluster with a real node. The volume is kept after the claim is
    deleted (Retain): its files are the test's or benchmark's to read."""
    path = Path(path).resolve()
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    pv = f"{namespace}-{name}"
    node_affinity = {
        "required": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}]}
            ]
        }
    }
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": pv},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": ["ReadWriteOnce"],  # one node: the real one
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": STORAGE_CLASS,
                    "local": {"path": str(path)},
                    "claimRef": {"namespace": namespace, "name": name},
                    "nodeAffinity": node_affinity,
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": STORAGE_CLASS,
                    "volumeName": pv,
                    "resources": {"requests": {"storage": size}},
                },
            },
        ]
    )

    def bound() -> bool:
        r = cluster.kubectl("get", "pvc", name, "-n", namespace, "-o", "jsonpath={.status.phase}", check=False)
        return r.stdout == "Bound"

    wait_until(bound, timeout=60, what=f"claim {namespace}/{name} Bound", on_fail=DevClusterError)
    return name

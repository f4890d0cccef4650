"""Kueue's side of a job: the Workload Kueue keeps for each attempt's child (a PyTorchJob, a JobSet),
read into a `Workload` fact for decide (situations `queued`, `admitted`, `preempted`).

A job with `spec.cluster.queueName` gets its child created suspended (a PyTorchJob's
`runPolicy.suspend`, a JobSet's `spec.suspend`), with Kueue's queue label, and from then on the
suspend flag is Kueue's: it unsuspends the child when it admits its
Workload, and suspends it again when it preempts or evicts it. The operator never writes the
flag, nor what Kueue injects at admission (the ResourceFlavor's nodeSelector and tolerations); it
only reads the Workload to say in `status.message` why the job waits, in Kueue's own words.

The Workload is found by Kueue's `kueue.x-k8s.io/job-uid` label (the child's uid, for every kind
Kueue integrates; Kueue names it `<kind>-<name>-<hash>`, which is not looked up), one LIST in
the job's namespace, made only while a situation asks for it (`Plan.need == "workload"`). Without
Kueue's CRD, or without the permission, or when Kueue does not manage the child's kind, there is
no Workload to read: the job is still Queued, and says so once it has waited long enough for one
(situations_kueue.py, NoKueueWorkload).
"""

from __future__ import annotations

import functools
import logging

from kubernetes.client.exceptions import ApiException

from ..policy.snapshot import Workload
from . import kube

log = logging.getLogger("llmtrain.operator")

JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def _conditions(obj: dict) -> dict[str, dict]:
    return {str(c.get("type")): c for c in (obj.get("status") or {}).get("conditions") or [] if isinstance(c, dict)}


def _true(c: dict | None) -> bool:
    return c is not None and c.get("status") == "True"


def workload_of(obj: dict) -> Workload:
    """The facts decide needs from one Workload object (Kueue v1beta1/v1beta2 conditions)."""
    conds = _conditions(obj)
    admitted = _true(conds.get("Admitted"))
    evicted = conds.get("Evicted")
    if admitted:
        message = (conds.get("Admitted") or {}).get("message") or ""
    else:
        # QuotaReserved=False carries why it waits ("couldn't assign flavors to pod set worker:
        # insufficient unused quota for nvidia.com/gpu in flavor p5-48xlarge, 8 more needed"),
        # also for a LocalQueue that does not exist; a deactivated Workload says why as well.
        reserved = conds.get("QuotaReserved") or {}
        message = reserved.get("message") or (conds.get("Admitted") or {}).get("message") or ""
    return Workload(
        name=(obj.get("metadata") or {}).get("name") or "",
        admitted=admitted,
        message=str(message)[:1024],
        evicted=(evicted or {}).get("reason") if _true(evicted) else None,
        evicted_message=str((evicted or {}).get("message") or "")[:1024] if _true(evicted) else "",
    )


def read(namespace: str, child_uid: str) -> Workload | None:
    """The Workload of a child, or None: none yet, no Kueue here, or no permission to read it
    (logged once per cause, the job carries on as Queued)."""
    if not child_uid:
        return None
    try:
        items = kube.list_workloads(namespace, f"{JOB_UID_LABEL}={child_uid}")
    except ApiException as err:
        if err.status in (403, 404):
            _note(err.status)
            return None
        raise
    if not items:
        return None
    newest = max(items, key=lambda w: (w.get("metadata") or {}).get("creationTimestamp") or "")
    return workload_of(newest)


@functools.cache  # once per process and status: a log line, not state any decision reads
def _note(status: int) -> None:
    why = "Kueue's Workload CRD is not installed" if status == 404 else "no permission to list Workloads"
    log.warning("cannot read Kueue Workloads (%s): queued jobs show no Kueue message", why)

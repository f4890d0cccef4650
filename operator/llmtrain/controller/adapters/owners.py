"""Which worker pods are an attempt's own: the uids of the objects that control them.

Anyone who may create pods in a namespace can label one like a worker (llmtrain.dev/job and
/attempt), so labels only say which attempt a pod claims to be. What the operator believes (the
pods it explains a stuck start with, scrapes rank 0 of, and blames nodes for) are the pods whose
controller owner is the attempt's child, or an object the child controls:

  * PyTorchJob: the pod's controller is the PyTorchJob itself: its uid (no read);
  * JobSet: the pod's controller is a batch Job, whose controller is the JobSet. The Job is read
    once by its name (backend.pod_owner_names) and its uid trusted only when its own controller
    reference names the JobSet's uid. A JobSet that never restarts (maxRestarts 0) keeps its Job,
    through Kueue's suspensions too, so the answer is kept per child uid (bounded, oldest first).

A Job that does not exist yet is not remembered: its pods cannot exist either, and the next look
reads it again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from ...backends import Backend
from ..policy.snapshot import Child

if TYPE_CHECKING:
    from types import ModuleType


def controller_uid(obj: dict) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid")
    return None


class PodOwners:
    LIMIT = 20000  # children remembered

    def __init__(self, kube: ModuleType):
        self._kube = kube
        self._lock = threading.Lock()
        self._known: OrderedDict[tuple[str, str], frozenset[str]] = OrderedDict()

    def cached(self, backend: Backend, namespace: str, child: Child) -> frozenset[str] | None:
        """The uids, when known without a read (None: `of` must read)."""
        if backend.owner is None:
            return frozenset({child.uid}) if child.uid else frozenset()
        with self._lock:
            return self._known.get((namespace, child.uid))

    def of(self, backend: Backend, namespace: str, child: Child) -> frozenset[str]:
        """The uids of the objects whose pods are `child`'s (blocking: may read the API)."""
        known = self.cached(backend, namespace, child)
        if known is not None or not child.uid or backend.owner is None:
            return known if known is not None else frozenset()
        names = backend.pod_owner_names(child.name)
        uids = set()
        for name in names:
            obj = self._kube.get_owner(backend.owner, namespace, name)
            if obj is not None and controller_uid(obj) == child.uid:
                uids.add((obj.get("metadata") or {}).get("uid") or "")
        found = frozenset(u for u in uids if u)
        if len(found) == len(names):
            with self._lock:
                self._known[(namespace, child.uid)] = found
                self._known.move_to_end((namespace, child.uid))
                while len(self._known) > self.LIMIT:
                    self._known.popitem(last=False)
        return found

    def forget(self, namespace: str, child_uid: str) -> None:
        with self._lock:
            self._known.pop((namespace, child_uid), None)


def trusted(pods: list[dict], owners: frozenset[str]) -> list[dict]:
    """The pod summaries (status.pod_summary) whose controller is one of `owners`."""
    return [p for p in pods if p.get("owner") and p["owner"] in owners]

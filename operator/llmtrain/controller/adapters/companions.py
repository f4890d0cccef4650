"""What a backend creates beside an attempt's child (Backend.companions: the job backend's headless
Service), made sure of once per child per operator process.

A companion is owned by its child, so it is created after it (it needs the child's uid). That
leaves a window: an operator killed between the two writes, restarted, finds the child through its
watch, never creates it again, and the attempt's pods wait for a DNS name that never resolves. So
act.finish makes sure of the companions of the current attempt's child whenever this process has not
yet: one create per live child after a start (a 409 means it is there), nothing after that.
Created only, never read: a tenant's object under that name in its own namespace only breaks its
own job's DNS."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from ...backends import Backend

if TYPE_CHECKING:
    from types import ModuleType


class Companions:
    LIMIT = 20000  # children remembered, oldest first out (one more create each, if it comes back)

    def __init__(self, kube: ModuleType):
        self._kube = kube
        self._lock = threading.Lock()
        self._made: OrderedDict[str, None] = OrderedDict()

    def ensure(self, backend: Backend, child: dict) -> None:
        """Create `child`'s companions unless this process has (the child as the API returned it)."""
        uid = (child.get("metadata") or {}).get("uid")
        if not backend.companion_kinds or not uid:
            return
        with self._lock:
            if uid in self._made:
                return
        for obj in backend.companions(child):
            self._kube.create_service(obj)
        with self._lock:
            self._made[uid] = None
            while len(self._made) > self.LIMIT:
                self._made.popitem(last=False)

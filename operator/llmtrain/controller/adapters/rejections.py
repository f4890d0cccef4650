"""When a refused create of an attempt's child is final.

400/403/422 are final at once (the reconciler marks the job Failed, AttemptRejected). Others
were retried forever with the work queue's backoff, so a job whose child the API server (or
etcd behind it) can never store kept a worker and a create every minute for good. Now:

  413            final at once: the same object is too large every time;
  5xx            final after MAX_TRIES consecutive refusals of the same attempt's create (about
                 30 s of the queue's backoff: a short API server or webhook outage passes, an
                 object etcd refuses, "request is too large" as a 500, does not);
  anything else  retried (a 409 or 429 is the API server's ordinary answer under load).

The count per job is forgotten on a create that succeeds, on a final refusal and when the job goes.
"""

from __future__ import annotations

import threading

from kubernetes.client.exceptions import ApiException

MAX_TRIES = 6


class Refusals:
    """One operator's count of consecutive refusals of each job's attempt's create (the Operator
    holds one: operator.py)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tries: dict[tuple[str, str, int], int] = {}

    def final(self, namespace: str, name: str, attempt: int, err: ApiException) -> bool:
        """Whether this refusal of attempt `attempt`'s create ends the job."""
        status = err.status or 0
        if status == 413:
            self.forget(namespace, name)
            return True
        if status < 500:
            return False
        with self._lock:
            n = self._tries[(namespace, name, attempt)] = self._tries.get((namespace, name, attempt), 0) + 1
        if n >= MAX_TRIES:
            self.forget(namespace, name)
            return True
        return False

    def tries(self, namespace: str, name: str, attempt: int) -> int:
        with self._lock:
            return self._tries.get((namespace, name, attempt), 0)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            for key in [k for k in self._tries if k[:2] == (namespace, name)]:
                del self._tries[key]

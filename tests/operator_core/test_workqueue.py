"""The reconciler's work queue (no cluster): one run per key at a time, the newest object wins,
keys are deduplicated, failures retry with capped exponential backoff, timed work runs when due."""

from __future__ import annotations

import contextvars
import threading
import time

from llmtrain.controller.handlers import restart_backoff
from llmtrain.controller.workqueue import WorkQueue


def obj(rv: int, value: str = "") -> dict:
    return {"metadata": {"resourceVersion": str(rv)}, "value": value}


def wait(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    raise AssertionError("timed out")


def start(queue: WorkQueue, n: int) -> None:
    queue.start([contextvars.copy_context() for _ in range(n)])


def test_a_key_runs_once_at_a_time_and_again_with_the_newest_object_after_a_change():
    seen, running, overlap = [], set(), []
    gate = threading.Event()

    def handler(key, o):
        if key in running:
            overlap.append(key)
        running.add(key)
        seen.append((key, o["value"]))
        if o["value"] == "first":
            gate.wait(5)
        running.discard(key)

    q = WorkQueue(handler, workers=4)
    start(q, 4)
    q.add("a", obj(1, "first"))
    wait(lambda: seen == [("a", "first")])
    for rv in (2, 3, 4):  # three changes while the first run is in progress: one more run, the newest
        q.add("a", obj(rv, f"v{rv}"))
    q.add("a", obj(3, "older"))  # an older object arriving late does not replace the newer one
    gate.set()
    wait(lambda: len(seen) == 2)
    time.sleep(0.1)
    assert seen == [("a", "first"), ("a", "v4")] and overlap == []


def test_failures_retry_with_capped_exponential_backoff_and_timed_work_runs_when_due():
    calls: list[float] = []

    def handler(key, o):
        calls.append(time.monotonic())
        if len(calls) <= 3:
            raise RuntimeError("API server unavailable")
        return None

    q = WorkQueue(handler, workers=1, retry_base=0.3, retry_cap=0.7)
    start(q, 1)
    q.add("k", obj(1))
    wait(lambda: len(calls) == 4)
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    # 0.3, 0.6, then the cap 0.7 (not 1.2); the upper bounds leave 0.25 s for a busy machine
    assert 0.29 <= gaps[0] < 0.55 and 0.59 <= gaps[1] < 0.85 and 0.69 <= gaps[2] < 0.95, gaps

    at = time.monotonic()
    q.add_after("k", 0.3)
    q.add_after("k", 5)  # a later request does not postpone the earlier one
    wait(lambda: len(calls) == 5)
    assert 0.29 <= calls[-1] - at < 1.0


def test_restart_backoff_doubles_from_the_initial_delay_up_to_the_cap():
    res = {"restartBackoffSeconds": 10, "maxRestartBackoffSeconds": 300}
    assert [restart_backoff(res, n) for n in range(7)] == [10, 20, 40, 80, 160, 300, 300]
    assert restart_backoff({}, 0) == 10  # the spec's defaults
    assert restart_backoff({"restartBackoffSeconds": 0}, 5) == 0

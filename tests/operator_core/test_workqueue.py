"""The reconciler's work queue (no cluster): one run per key at a time, the newest object wins,
keys are deduplicated, failures retry with capped exponential backoff, timed work runs when due."""

from __future__ import annotations

import contextvars
import threading
import time

from llmtrain.controller.policy.decide import restart_backoff
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
    # never below the operator's floor (--min-restart-backoff-seconds, default 5 s)
    assert restart_backoff({"restartBackoffSeconds": 0}, 0) == 5


def _settling_queue(settle_at=None, fail_on=()):
    """One worker; the handler records (key, value) and settles on the object it got (or on
    `settle_at(o)`), raising for values in `fail_on`. A run of the marker key "z" after an add
    shows whether that add queued anything: with one worker, keys run in the order queued."""
    seen = []
    q = WorkQueue(lambda key, o: None, workers=1, retry_base=30)

    def handler(key, o):
        seen.append((key, o["value"] if o else None))
        if o and o["value"] in fail_on:
            raise RuntimeError("boom")
        q.settle(key, settle_at(o) if settle_at else o)

    q._handler = handler
    start(q, 1)
    marks = iter(range(1000))

    def after(*adds):
        for a in adds:
            a()
        n = next(marks)
        q.add(f"z{n}")
        wait(lambda: (f"z{n}", None) in seen)
        return [s for s in seen if not s[0].startswith("z")]

    return q, seen, after


def test_an_event_bringing_the_version_a_run_settled_on_does_not_run_it_again():
    q, _seen, after = _settling_queue()
    assert after(lambda: q.add("a", obj(5, "v5"))) == [("a", "v5")]
    # the watch's echo of the run's own write, and an older event arriving late: nothing to do
    assert after(lambda: q.add("a", obj(5, "v5")), lambda: q.add("a", obj(4, "v4"))) == [("a", "v5")]
    # a newer version runs; so does an add without an object (another watch, a timer)
    assert after(lambda: q.add("a", obj(6, "v6"))) == [("a", "v5"), ("a", "v6")]
    assert after(lambda: q.add("a")) == [("a", "v5"), ("a", "v6"), ("a", "v6")]
    # the settled version is per key: another key with the same version runs
    assert after(lambda: q.add("b", obj(6, "b6")))[-1] == ("b", "b6")
    # a key that went away and came back (same name, new object) is not settled
    q.forget("a")
    assert after(lambda: q.add("a", obj(6, "again")))[-1] == ("a", "again")


def test_settling_keys_on_the_version_the_run_ended_with_not_the_one_it_started_from():
    # The run starts from v5 and writes (v7, its own status write): it settles on v7. The echo of
    # v7 queues nothing, but v6 (someone else's write the run never saw) must not be skipped
    # because the run *started* before it, nor v8 because it is close.
    q, _seen, after = _settling_queue(settle_at=lambda o: obj(7, "written"))
    after(lambda: q.add("a", obj(5, "v5")))
    assert after(lambda: q.add("a", obj(7, "echo"))) == [("a", "v5")]
    assert after(lambda: q.add("a", obj(8, "v8"))) == [("a", "v5"), ("a", "v8")]


def test_an_echo_that_arrives_while_the_run_is_in_progress_is_dropped_a_newer_event_is_not():
    gate, started = threading.Event(), threading.Event()
    seen = []
    q = WorkQueue(lambda key, o: None, workers=1)

    def handler(key, o):
        seen.append(o["value"])
        if o["value"] == "v5":
            started.set()
            gate.wait(5)
            q.settle(key, obj(6, "written"))  # the run wrote v6
        else:
            q.settle(key, o)

    q._handler = handler
    start(q, 1)
    q.add("a", obj(5, "v5"))
    assert started.wait(5)
    q.add("a", obj(6, "echo"))  # the echo of the write arrives before the run ends
    gate.set()
    q.add("b", obj(1, "marker"))
    wait(lambda: "marker" in seen)
    assert seen == ["v5", "marker"]
    # the same while a newer version arrives too: one more run, with the newest object
    gate.clear()
    started.clear()
    seen.clear()
    q.add("c", obj(5, "v5"))
    assert started.wait(5)
    q.add("c", obj(6, "echo"))
    q.add("c", obj(9, "v9"))
    gate.set()
    wait(lambda: seen == ["v5", "v9"])


def test_a_failed_run_forgets_what_was_settled():
    q, _seen, after = _settling_queue(fail_on=("v6",))
    after(lambda: q.add("a", obj(5, "v5")))
    after(lambda: q.add("a", obj(6, "v6")))  # fails (its retry is 30 s away)
    assert after(lambda: q.add("a", obj(5, "v5-again"))) == [("a", "v5"), ("a", "v6"), ("a", "v6")]


def test_a_runs_requeue_replaces_the_one_an_earlier_run_asked_for():
    # Right after an operator start a job's first run waits for its PyTorchJob (look again in
    # 0.3 s); the PyTorchJob's event runs it again, and that run asks for its steady interval. The
    # earlier 0.3 s look is stale: nothing runs then.
    runs: list[float] = []

    def handler(key, o):
        runs.append(time.monotonic())
        return 0.3 if len(runs) == 1 else 30.0

    q = WorkQueue(handler, workers=2)
    start(q, 2)
    q.add("job", obj(1))
    wait(lambda: len(runs) == 1)
    q.add("job")  # the PyTorchJob's event
    wait(lambda: len(runs) == 2)
    time.sleep(0.6)
    assert len(runs) == 2, f"the first run's 0.3 s requeue ran anyway: {len(runs)} runs"
    # None (nothing to wait for) cancels a pending look too; a run's requeue still runs when due
    answers = iter([0.3, None, 0.2])
    runs.clear()
    q._handler = lambda key, o: (runs.append(time.monotonic()), next(answers))[1]
    q.add("other")
    wait(lambda: len(runs) == 1)
    q.add("other")
    wait(lambda: len(runs) == 2)
    time.sleep(0.6)
    assert len(runs) == 2
    q.add("other")
    wait(lambda: len(runs) == 3)
    q._handler = lambda key, o: runs.append(time.monotonic())
    wait(lambda: len(runs) == 4)
    assert 0.19 <= runs[3] - runs[2] < 1.0


class _CountingCondition(threading.Condition):
    waits = 0

    def wait(self, timeout=None):
        type(self).waits += 1
        return super().wait(timeout)


def test_idle_workers_do_not_wake_for_every_timer():
    # Each timer that fires wakes the one worker that runs its key, not every idle worker: with the
    # workers waiting for the next due time themselves, 600 timers woke 32 workers each (0.5 s of
    # CPU, against 0.05 s with one worker).
    done: list[str] = []
    q = WorkQueue(lambda key, o: done.append(key), workers=16)
    q._cv = _CountingCondition(q._cv._lock)  # type: ignore[attr-defined]  # the workers' condition
    start(q, 16)
    wait(lambda: _CountingCondition.waits >= 16)  # every worker idle
    before = _CountingCondition.waits
    for i in range(40):
        q.add_after(f"k{i}", 0.05 + i * 0.01)
    wait(lambda: len(done) == 40)
    wakes = _CountingCondition.waits - before
    assert wakes <= 3 * 40, f"{wakes} worker wake-ups for 40 timers"

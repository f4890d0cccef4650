"""decide() over random histories (hypothesis), no cluster: a simulated job whose children (the
PyTorchJobs or the JobSets of its backend, each as its controller leaves it) change state, fail,
get deleted by hand, whose spec is suspended and resumed, whose writes conflict, whose operator
restarts, and whose clock moves. Carried out the way act.py does (create, one conditional status
write, delete older attempts), these must hold after every step, on every backend:

  * status.attempt and status.restarts never go down;
  * no attempt's child is created twice (unless someone deleted it by hand meanwhile);
  * restarts never exceed spec.resilience.maxRestarts;
  * Succeeded and Failed stay;
  * never two live children, and none of an attempt later than status.attempt;
  * an ended job has no ETA, and one that succeeded shows the trainer's final step when its pods
    left a final summary;
  * status.goodput's buckets add up to its wall time; what an attempt's record says its straggler
    verdicts lost (slowSeconds) never goes down, and only the current attempt's open record has an
    open span (slowSince), while status.straggler names that attempt.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtrain import backends
from llmtrain.controller.adapters.act import wire
from llmtrain.controller.policy.child_status import parse_time
from llmtrain.controller.policy.progress import Progress, timestamp
from llmtrain.controller.policy.sicknodes import SickNode
from llmtrain.controller.policy.snapshot import CreateResult
from llmtrain.stragglers import RankScore, Window

from .decide_world import CFG, NOW, batch_job_status, child, decide_, jobset_status, snap, tiny

NO_FLOOR = replace(CFG, min_restart_backoff=0.0)
SICK = SickNode("n1", "AcceleratedHardwareReady", "NvidiaXID79Error")
SLOW = Window((RankScore(3, "n1", 2.0, 1.8),))
HEALTHY = Window((RankScore(3, "n1", 1.05, 1.0),))  # restartBackoffSeconds 0 restarts at once

STATES = ("Created", "Running", "Restarting", "Succeeded", "Failed")
EVENTS = st.one_of(
    st.tuples(st.just("state"), st.sampled_from(STATES)),
    st.tuples(st.just("tick"), st.sampled_from((1, 15, 400, 1900, 3600))),
    st.tuples(st.just("suspend"), st.booleans()),
    st.tuples(st.just("delete_child"), st.none()),
    st.tuples(st.just("operator_restart"), st.none()),
    st.tuples(st.just("nan"), st.none()),
    st.tuples(st.just("heartbeat"), st.none()),
    st.tuples(st.just("conflict"), st.none()),
    st.tuples(st.just("reject_create"), st.none()),
    st.tuples(st.just("kueue_suspend"), st.booleans()),  # Kueue takes the child back / admits it
    st.tuples(st.just("scrape"), st.none()),  # the monitor's write: progress with an ETA, while Running
    st.tuples(st.just("sick"), st.booleans()),  # a watched condition of the attempt's node False / True again
    st.tuples(st.just("slow"), st.booleans()),  # rank 0 reports a straggler on the attempt's node / none
)
FINAL_STEP = 20  # tiny()'s maxSteps: where the trainer's final summary says it ended
BACKENDS = tuple(backends.BACKENDS)  # every backend: a new one is in the histories at once
# how a backend's controller leaves its child in a state, where that is not the PyTorchJob's conditions
STATUS_OF = {"jobset": jobset_status, "job": batch_job_status}


def merged(before: dict, update: dict) -> dict:
    """`update` applied to `before` as a JSON merge patch (what act.py's status write is)."""
    out = dict(before)
    for key, value in update.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


class World:
    def __init__(
        self,
        max_restarts: int,
        backoff: int,
        summary: bool = False,
        backend: str = "pytorchjob",
        workload=None,
        stragglers: dict | None = None,
    ):
        self.backend = backend
        self.workload = workload  # what Kueue says about the child (None: no Workload, Kueue does not manage it)
        self.spec = tiny(
            resilience={
                "maxRestarts": max_restarts,
                "restartBackoffSeconds": backoff,
                "startupTimeoutMinutes": 30,
                "hangTimeoutMinutes": 30,
                **({"stragglers": stragglers} if stragglers else {}),
            },
            **({"checkpoint": {"uri": "s3://bucket/ckpt/"}} if stragglers else {}),
        )
        self.max_restarts = max_restarts
        self.generation = 1
        self.status: dict = {}
        self.children: dict[str, dict] = {}
        self.now = NOW
        self.first_sight = True
        self.progress: tuple[int, Progress] | None = None
        self.created: dict[str, int] = {}
        self.deleted_by_hand: set[str] = set()
        self.conflict_next = False
        self.reject_next = False
        self.summary = summary  # the pods leave the trainer's final summary when they succeed
        self.history: list = []
        self.sick = False  # a watched condition False on the node under every attempt (sicknodes.py)
        self.slow = False  # rank 0 reports a straggler on the node of every attempt (slownodes.py)

    def current(self) -> dict | None:
        return self.children.get(f"j-a{self.status.get('attempt') or 1}")

    def apply(self, kind, arg) -> None:
        self.history.append((kind, arg))
        if kind == "state" and self.current() is not None and self.backend in STATUS_OF:
            if arg != "Restarting":  # a JobSet (failurePolicy.maxRestarts 0), a Job (backoffLimit 0) never restart
                self.current()["status"] = STATUS_OF[self.backend](arg, at=timestamp(self.now))
        elif kind == "state" and self.current() is not None:
            child = self.current()
            conds = [{"type": "Created", "status": "True", "lastTransitionTime": timestamp(self.now)}]
            if arg != "Created":
                conds.append(
                    {
                        "type": arg,
                        "status": "True",
                        "lastTransitionTime": timestamp(self.now),
                        "message": "replica worker failed" if arg == "Failed" else "",
                    }
                )
            child["status"] = {"conditions": conds}
        elif kind == "tick":
            self.now += dt.timedelta(seconds=arg)
        elif kind == "suspend":
            if bool(self.spec.get("suspend")) != arg:
                self.spec = {**self.spec, "suspend": arg}
                self.generation += 1
        elif kind == "delete_child" and self.current() is not None:
            name = self.current()["metadata"]["name"]
            del self.children[name]
            self.deleted_by_hand.add(name)
        elif kind == "operator_restart":
            self.first_sight = True
        elif kind == "nan" and self.status.get("phase") == "Running":
            self.progress = (
                self.status.get("attempt") or 1,
                Progress(step=5, nonfinite_loss_max_steps=3, nonfinite_loss_first_step=3),
            )
        elif kind == "heartbeat" and self.status.get("phase") == "Running":
            self.status = {**self.status, "progress": {"heartbeatTime": timestamp(self.now)}}
        elif kind == "conflict":
            self.conflict_next = True
        elif kind == "reject_create":
            self.reject_next = True
        elif kind == "kueue_suspend" and self.current() is not None:
            if self.backend in STATUS_OF:  # a JobSet's, a Job's own flag
                self.current()["spec"]["suspend"] = arg
            else:
                self.current().setdefault("spec", {})["runPolicy"] = {"suspend": arg}
        elif kind == "scrape" and self.status.get("phase") == "Running":
            attempt = self.status.get("attempt") or 1
            eta = {"estimatedRemainingSeconds": 60, "estimatedCompletionTime": timestamp(self.now)}
            loop = {"trainStartTime": self.status.get("attemptStartTime") or timestamp(self.now)}
            self.status = merged(self.status, {"progress": {"attempt": attempt, "step": 5, **eta, **loop}})
        elif kind == "sick":
            self.sick = arg
        elif kind == "slow":
            self.slow = arg

    def observed(self, **facts):
        attempt = self.status.get("attempt") or 1
        progress = self.progress[1] if self.progress and self.progress[0] == attempt else None
        if self.status.get("phase") == "Running":
            window = SLOW if self.slow else HEALTHY
            progress = replace(progress or Progress(step=5), stragglers=window)
        return snap(
            self.status,
            spec=self.spec,
            children=list(self.children.values()),
            generation=self.generation,
            now=self.now,
            first_sight=self.first_sight,
            progress=progress if self.status.get("phase") == "Running" else None,
            backend=self.backend,
            sick_nodes=(SICK,) if self.sick and self.current() is not None else (),
            pod_nodes=frozenset({"n1"}),
            creation_time=NOW,
            **facts,
        )

    def reconcile(self) -> None:
        o = self.observed()
        for _ in range(12):
            plan = decide_(o, NO_FLOOR)
            if plan.need == "failures":
                o = o.with_(failures=())
                continue
            if plan.need == "ready_nodes":
                o = o.with_(ready_nodes=None, ready_nodes_read=True)
                continue
            if plan.need == "workload":
                o = o.with_(workload=self.workload, workload_read=True)
                continue
            if plan.need == "final":
                o = o.with_(final=Progress(step=FINAL_STEP) if self.summary else None, final_read=True)
                continue
            if plan.create is not None:
                o = o.with_(created=self._create(plan.create))
                continue
            if plan.status is not None:
                if self.conflict_next:  # someone wrote in between: read again, decide again
                    self.conflict_next = False
                    o = self.observed()
                    continue
                self._write(wire(plan.status))
            self._delete(plan.delete)
            if plan.status is None:
                return
            self.first_sight = self.first_sight and plan.outcome is None
            o = self.observed()

    def _create(self, obj: dict) -> CreateResult:
        name = obj["metadata"]["name"]
        if self.reject_next:
            self.reject_next = False
            return CreateResult(name, "rejected", "422 Unprocessable Entity")
        rdzv = obj["metadata"]["annotations"]["llmtrain.dev/rendezvous-id"]
        assert obj["kind"] == backends.get(self.backend).child.kind, obj["kind"]
        if name in self.children:
            return CreateResult(name, "adopted", rendezvous_id=rdzv)
        assert name not in self.created or name in self.deleted_by_hand, f"{name} created twice: {self.history}"
        self.deleted_by_hand.discard(name)
        self.created[name] = self.created.get(name, 0) + 1
        attempt = int(name.rsplit("-a", 1)[1])
        assert attempt == (self.status.get("attempt") or 1), (name, self.status)
        self.children[name] = child(self.backend, attempt, None, raw_spec=self.spec)
        return CreateResult(name, "created", rendezvous_id=rdzv)

    def _write(self, update: dict) -> None:
        before = self.status
        after = merged(before, update)
        hist = self.history
        assert (after.get("attempt") or 1) >= (before.get("attempt") or 1), hist
        assert (after.get("restarts") or 0) >= (before.get("restarts") or 0), hist
        assert (after.get("restarts") or 0) <= self.max_restarts, (after, hist)
        assert (after.get("nodeMoves") or 0) >= (before.get("nodeMoves") or 0), hist
        assert (after.get("stragglerReplacements") or 0) >= (before.get("stragglerReplacements") or 0), hist
        if before.get("phase") in ("Succeeded", "Failed"):
            raise AssertionError(f"a terminal job was written: {before} → {update} after {hist}")
        if (after.get("attempt") or 1) > (before.get("attempt") or 1):
            assert after["attempt"] == (before.get("attempt") or 1) + 1, hist
        kept = {r["attempt"]: r for r in (after.get("goodput") or {}).get("attempts") or []}
        for r in (before.get("goodput") or {}).get("attempts") or []:  # the lost time is a tally: it only grows
            if r["attempt"] in kept:
                assert (kept[r["attempt"]].get("slowSeconds") or 0) >= (r.get("slowSeconds") or 0), hist
        self.status = after

    def _delete(self, names) -> None:
        attempt = self.status.get("attempt") or 1
        for name in list(names) + [
            n for n, c in self.children.items() if int(c["metadata"]["labels"]["llmtrain.dev/attempt"]) < attempt
        ]:
            self.children.pop(name, None)

    def check(self) -> None:
        attempt = self.status.get("attempt") or 1
        live = [c for c in self.children.values() if not c["metadata"].get("deletionTimestamp")]
        assert len(live) <= 1, (list(self.children), self.history)
        assert all(int(c["metadata"]["labels"]["llmtrain.dev/attempt"]) <= attempt for c in live), self.history
        g = self.status.get("goodput") or {}
        if g.get("seconds"):  # each bucket is rounded to 0.1 s
            assert sum(g["seconds"].values()) == pytest.approx(g["wallSeconds"], abs=0.5), (g, self.history)
        spans = [r for r in g.get("attempts") or [] if r.get("slowSince")]
        for r in spans:
            straggler = self.status.get("straggler") or {}
            assert r["attempt"] == attempt == straggler.get("attempt") and not r.get("endTime"), (g, self.history)
        progress = self.status.get("progress") or {}
        if self.status.get("phase") in ("Succeeded", "Failed"):
            assert "estimatedCompletionTime" not in progress, (self.status, self.history)
            assert "estimatedRemainingSeconds" not in progress, (self.status, self.history)
        if self.status.get("phase") == "Succeeded" and self.summary:
            assert (progress.get("attempt"), progress.get("step")) == (attempt, FINAL_STEP), (progress, self.history)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    max_restarts=st.integers(0, 3),
    backoff=st.sampled_from((0, 10)),
    events=st.lists(EVENTS, min_size=1, max_size=40),
    summary=st.booleans(),
)
def test_random_histories_keep_the_invariants(backend, max_restarts, backoff, events, summary):
    world = World(max_restarts, backoff, summary, backend)
    world.reconcile()
    terminal = None
    for kind, arg in events:
        world.apply(kind, arg)
        world.reconcile()
        world.check()
        if terminal is not None:
            assert world.status.get("phase") == terminal, world.history
        if world.status.get("phase") in ("Succeeded", "Failed"):
            terminal = world.status["phase"]


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ticks=st.lists(st.sampled_from((1, 15, 400, 1900, 3600, 5 * 3600)), min_size=1, max_size=20),
    preempt=st.booleans(),
    managed=st.booleans(),
)
def test_waiting_in_kueue_never_spends_a_restart(backend, ticks, preempt, managed):
    """However long Kueue keeps the child suspended (first, or again after a preemption), the job
    stays Pending at attempt 1 with restarts 0: queued is not stuck. When Kueue does not manage
    the child's kind (no Workload: Kueue's default integrations leave PyTorchJob out since v0.19),
    a new attempt says so once the wait for one is over (NoKueueWorkload), instead of Queued."""
    from llmtrain.controller.policy.snapshot import Workload

    workload = (
        Workload("w", message="couldn't assign flavors to pod set worker: insufficient quota") if managed else None
    )
    world = World(3, 0, backend=backend, workload=workload)
    world.reconcile()
    if preempt:
        world.apply("state", "Running")
        world.reconcile()
    world.apply("kueue_suspend", True)
    world.reconcile()
    for t in ticks:
        world.apply("tick", t)
        world.reconcile()
        assert world.status["phase"] == "Pending", world.history
        assert (world.status["attempt"], world.status.get("restarts") or 0) == (1, 0), world.history
        silent = not managed and world.now - NOW >= dt.timedelta(seconds=CFG.kueue_workload_wait)
        want = "Preempted" if preempt else "NoKueueWorkload" if silent else "Queued"
        assert world.status["reason"] == want, world.status
    world.apply("kueue_suspend", False)
    world.reconcile()
    # admitted (and Running again at once where its conditions already say so), restarts still 0
    assert world.status["admissionTime"] == timestamp(world.now), world.status
    assert world.status["reason"] == ("Running" if preempt else "Admitted") and world.status["restarts"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(max_restarts=st.integers(0, 3), n=st.integers(1, 8))
def test_failing_again_and_again_ends_failed_after_exactly_the_budget(backend, max_restarts, n):
    """Every attempt fails as soon as it exists: the job spends maxRestarts restarts, then Failed."""
    world = World(max_restarts, 0, backend=backend)
    world.reconcile()
    for _ in range(max_restarts + 2):
        world.apply("state", "Failed")
        world.reconcile()
    assert world.status["phase"] == "Failed" and world.status["reason"] == "RestartBudgetExhausted"
    assert world.status["restarts"] == max_restarts and world.status["attempt"] == max_restarts + 1
    assert sorted(world.created) == sorted(f"j-a{i}" for i in range(1, max_restarts + 2))


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    max_restarts=st.integers(0, 3),
    flaps=st.lists(st.tuples(st.booleans(), st.sampled_from(("Created", "Running", None))), min_size=1, max_size=40),
)
def test_a_flapping_sick_node_cannot_restart_a_job_without_end(backend, max_restarts, flaps):
    """The worst case for a flapping node: no other node to go to (the Ready nodes cannot be
    counted, so nothing is avoided) and every new attempt lands on it again. However its condition
    flaps, the job is moved at most free_node_moves times without spending a restart, then spends
    its budget, then fails: attempts ≤ 1 + free moves + maxRestarts."""
    world = World(max_restarts, 0, backend=backend)
    world.reconcile()
    for sick, state in flaps:
        world.apply("sick", sick)
        if state is not None:
            world.apply("state", state)
        world.reconcile()
        world.check()
        moves = world.status.get("nodeMoves") or 0
        assert world.status["attempt"] <= 1 + moves + (world.status.get("restarts") or 0), world.history
        assert world.status["attempt"] <= 1 + NO_FLOOR.free_node_moves + max_restarts, world.history
    world.apply("sick", True)
    for _ in range(NO_FLOOR.free_node_moves + max_restarts + 2):
        world.apply("state", "Running")
        world.reconcile()
    assert world.status["phase"] == "Failed" and world.status["reason"] == "RestartBudgetExhausted", world.history
    assert world.status["attempt"] == 1 + NO_FLOOR.free_node_moves + max_restarts
    assert world.status["restarts"] == max_restarts and world.status["nodeMoves"] >= NO_FLOOR.free_node_moves


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cap=st.integers(0, 3),
    events=st.lists(
        st.one_of(
            st.tuples(st.just("slow"), st.booleans()),
            st.tuples(st.just("tick"), st.sampled_from((15, 400, 1900))),
            st.tuples(st.just("state"), st.just("Running")),
        ),
        min_size=1,
        max_size=40,
    ),
)
def test_replacing_stragglers_never_passes_its_cap_nor_spends_a_restart(backend, cap, events):
    """stragglers action replace, a run that always has hours left (every replacement pays): however
    the straggler comes and goes, the job is replaced at most maxReplacements times, never before it
    was slow for durationMinutes, and no restart is spent."""
    world = World(3, 0, backend=backend, stragglers={"action": "replace", "durationMinutes": 5, "maxReplacements": cap})
    world.reconcile()
    for kind, arg in events:
        if kind == "tick" and world.status.get("phase") != "Running":
            kind, arg = "state", "Running"  # time passes while it trains (not while it starts: StartupTimeout)
        world.apply(kind, arg)
        if world.status.get("phase") == "Running":  # steps complete (no Hang); the ETA: ten hours left
            world.apply("heartbeat", None)
            world.status = merged(world.status, {"progress": {"estimatedRemainingSeconds": 36000}})
        before = world.status.get("stragglerReplacements") or 0
        since = (world.status.get("straggler") or {}).get("since")
        world.reconcile()
        world.check()
        after = world.status.get("stragglerReplacements") or 0
        assert after <= cap and (world.status.get("restarts") or 0) == 0, world.history
        assert world.status["attempt"] == 1 + after, world.history
        if after > before:  # replaced: it had been slow for durationMinutes
            assert since is not None and (world.now - parse_time(since)).total_seconds() >= 300, world.history

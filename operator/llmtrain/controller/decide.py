"""decide(observed, config) -> Plan: the job's state machine, as one pure function.

No I/O, no clock (the snapshot's `now`), no globals, no kopf or kubernetes: the only code that sets
status.phase, attempt, restarts, reason and the conditions. It is a table of situations, each a
small function that returns a Plan when it applies (None otherwise), tried in order; the first one
that applies decides. A new situation (a Kueue admission, a goodput fact) is a new function and
a row in SITUATIONS, and the state diagram (docs/reference/state-machine.md) is generated from
the rows' `Transition`s (scripts/gen-state-diagram.py).

Invariants (tests/operator_core/test_decide_properties.py checks them over random histories):
  * status.attempt and status.restarts never go down; a restart raises attempt by one;
  * restarts never exceed spec.resilience.maxRestarts: beyond it the job is Failed;
  * a terminal phase (Succeeded, Failed) stays;
  * attempt N's PyTorchJob is created only from a snapshot that says attempt N and has none.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from typing import Callable

import yaml

from ..planner import plan_job
from ..render import pytorchjob_name, render_pytorchjob, rendezvous_id
from ..spec import LLMTrainingJobSpec, ResilienceSpec, model_summary
from ..status import STUCK, ConditionType, Phase, Reason
from . import forensics, health
from .config import OperatorConfig
from .snapshot import Event, Observed, Plan
from .status import PHASE_OF, parse_time, set_condition, startup_problem, timestamp

READY, VALIDATED, SPEC_ACCEPTED = ConditionType.READY, ConditionType.VALIDATED, ConditionType.SPEC_ACCEPTED
SPEC_HASH = "llmtrain.dev/spec-hash"
MUTABLE_SECTIONS = ("resilience", "checkpoint", "suspend")
WATCH_WAIT = 1.0  # seconds between looks while the watch may still bring a recorded PyTorchJob


@dataclass(frozen=True)
class Transition:
    """One edge a situation can take, for the state diagram: from phases → to phase, with reason."""
    frm: tuple[str, ...]
    to: str
    reason: Reason | None


Situation = Callable[[Observed, OperatorConfig], "Plan | None"]


def situation(*edges: Transition):
    def mark(fn):
        fn.transitions = edges
        return fn
    return mark


# --- pure helpers --------------------------------------------------------------------------------

def spec_hash(raw_spec: dict) -> str:
    """Hash of the sections that shape the pods (everything but the mutable ones)."""
    fixed = {k: v for k, v in raw_spec.items() if k not in MUTABLE_SECTIONS}
    fixed["checkpoint.uri"] = (raw_spec.get("checkpoint") or {}).get("uri")
    return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:16]


def plan_status(spec: LLMTrainingJobSpec) -> dict:
    plan = plan_job(spec)
    return {"memoryPerGpuGiB": round(plan.total_bytes / 1024**3, 2), "fits": plan.fits,
            "flopsPerToken": float(plan.flops_per_token), "numParams": plan.num_params,
            "expectedTokensPerSecond": round(plan.tokens_per_second, 1)}


def restart_backoff(resilience, restarts: int) -> float:
    """Seconds before attempt N+1 after the `restarts`-th restart spent: restartBackoffSeconds,
    doubling with every restart already spent, at most maxRestartBackoffSeconds."""
    if isinstance(resilience, dict):  # the wire form (spec.resilience)
        first = float(resilience.get("restartBackoffSeconds", 10))
        cap = float(resilience.get("maxRestartBackoffSeconds", 300))
    else:
        first, cap = float(resilience.restart_backoff_seconds), float(resilience.max_restart_backoff_seconds)
    return min(cap, first * 2 ** min(max(restarts, 0), 30))


def resilience_of(o: Observed) -> ResilienceSpec:
    """The job's current spec.resilience (mutable: the newest generation's), defaults filled in."""
    if o.spec is not None:
        return o.spec.resilience
    try:
        return ResilienceSpec.model_validate(o.raw_spec.get("resilience") or {})
    except ValueError:
        return ResilienceSpec()


def _conds(o: Observed) -> list[dict]:
    return list(o.raw_status.get("conditions") or [])


def _cond(o: Observed, conds: list[dict], type_, ok: bool, reason: Reason, message: str) -> list[dict]:
    return set_condition(conds, type_, ok, reason, message, o.generation, o.now)


def _failed(o: Observed, reason: Reason, message: str) -> dict:
    """The status update that marks a job Failed."""
    return {"phase": Phase.FAILED, "reason": reason, "message": message,
            "conditions": _cond(o, _conds(o), READY, False, reason, message),
            "completionTime": timestamp(o.now), "observedGeneration": o.generation}


def fail(o: Observed, situation_name: str, reason: Reason, message: str, outcome: str = "invalid",
         **extra) -> Plan:
    return Plan(situation_name, status=_failed(o, reason, message),
                events=(Event(True, reason, message),), outcome=outcome, **extra)


def restart(o: Observed, name: str, cause: Reason, message: str, *, spend: bool = True,
            amend: Callable[[dict], dict | None] | None = None, outcome: str | None = "restarted") -> Plan:
    """The next attempt (fresh rendezvous id, resumes from the newest checkpoint), or Failed when
    the restart budget is spent. `spend=False`: the new attempt does not count against
    maxRestarts and starts at once (it never trained through no fault of the job: a failed
    preflight, a resume after suspend). `amend(update)` adds the cause's own fields in place and
    may return the plan fields it implies (taints)."""
    st, r = o.status, resilience_of(o)
    restarts, attempt = st.restarts or 0, o.attempt
    old = st.pytorch_job
    if spend and restarts >= r.max_restarts:
        update = _failed(o, Reason.RESTART_BUDGET_EXHAUSTED,
                         f"attempt {attempt} {cause.words}: {message}; {restarts} of {r.max_restarts} restarts used")
        extra = (amend(update) if amend else None) or {}
        return Plan(name, status=update, delete=(old,) if old and cause in STUCK else (),
                    events=(Event(True, Reason.RESTART_BUDGET_EXHAUSTED, update["message"]),),
                    outcome=outcome, **{k: v for k, v in extra.items() if k != "taint"})
    nxt = attempt + 1
    delay = restart_backoff(r, restarts) if spend else 0.0
    due = o.now + dt.timedelta(seconds=delay)
    if due.microsecond:  # status times have whole seconds: round up, never start early
        due = due.replace(microsecond=0) + dt.timedelta(seconds=1)
    when = f"at {timestamp(due)} (restart backoff {delay:.0f} s)" if delay >= 1 else "now"
    update = {"phase": Phase.RESTARTING, "attempt": nxt, "restarts": restarts + (1 if spend else 0),
              "reason": cause, "pytorchJob": pytorchjob_name(o.name, nxt),
              "rendezvousId": rendezvous_id(o.namespace, o.name, o.uid, nxt),
              "attemptCreationTime": timestamp(due), "nextAttemptTime": timestamp(due) if delay >= 1 else None,
              "message": f"attempt {attempt} {cause.words}: {message}; starting attempt {nxt} "
                         f"{when} from the newest checkpoint",
              "conditions": _cond(o, _conds(o), READY, False, Reason.RESTARTING, f"attempt {attempt} {cause.words}")}
    extra = (amend(update) if amend else None) or {}
    return Plan(name, status=update, delete=(old,) if old else (),
                events=(Event(True, Reason.RESTARTING, update["message"]),), outcome=outcome,
                restart=cause, **extra)


def needs_ready_nodes(o: Observed, blamed=()) -> bool:
    return not o.ready_nodes_read and forensics.needs_ready_nodes(o.spec, blamed, o.raw_status.get("badNodes"))


def _stuck_amend(o: Observed, cause: Reason, then: Callable[[dict], None] | None = None):
    def amend(update: dict) -> None:
        forensics.amend_stuck(update, cause, spec=o.spec, attempt=o.attempt,
                              bad_nodes=o.raw_status.get("badNodes") or [], ready=o.ready_nodes)
        if then is not None:
            then(update)
    return amend


def _restart_stuck(o: Observed, name: str, cause: Reason, message: str, then=None) -> Plan:
    st, r = o.status, resilience_of(o)
    if needs_ready_nodes(o) and not ((st.restarts or 0) >= r.max_restarts):
        return Plan(name, need="ready_nodes")
    return restart(o, name, cause, message, amend=_stuck_amend(o, cause, then), outcome=None)


# --- situations, in the order they are tried -----------------------------------------------------

ANY_ACTIVE = ("Pending", "Running", "Restarting")
LIVE = ANY_ACTIVE + ("Suspended",)


@situation()
def terminal(o: Observed, cfg) -> Plan | None:
    """Succeeded and Failed are final: nothing is written again."""
    if o.status.phase is not None and o.status.phase.terminal:
        return Plan("terminal", outcome="unchanged" if o.first_sight else None)
    return None


@situation(Transition(("[*]",), "Failed", Reason.INVALID_SPEC))
def new_invalid(o: Observed, cfg) -> Plan | None:
    """A new job whose spec does not validate: Failed with the validation's message, no PyTorchJob."""
    if o.status.phase is None and o.spec is None:
        return fail(o, "new_invalid", Reason.INVALID_SPEC, o.spec_error or "invalid spec")
    return None


def _validated_conditions(o: Observed, conds: list[dict]) -> list[dict]:
    return _cond(o, conds, VALIDATED, True, Reason.SPEC_VALID, "the spec passed validation")


@situation(Transition(("[*]",), "Suspended", Reason.SUSPENDED))
def new_suspended(o: Observed, cfg) -> Plan | None:
    """A new job created with spec.suspend true: Suspended, attempt 1 not started."""
    if o.status.phase is not None or not o.raw_spec.get("suspend"):
        return None
    conds = _cond(o, _validated_conditions(o, []), READY, False, Reason.SUSPENDED, "spec.suspend is true")
    return Plan("new_suspended", status={
        "phase": Phase.SUSPENDED, "attempt": 1, "restarts": 0, "observedGeneration": o.generation,
        "model": model_summary(o.spec.model), "plan": plan_status(o.spec), "conditions": conds,
        "reason": Reason.SUSPENDED, "message": "created suspended: spec.suspend is true"},
        events=(Event(False, Reason.SUSPENDED, "created suspended (spec.suspend is true)"),), outcome="suspended")


@situation(Transition(("[*]",), "Pending", Reason.CREATED), Transition(("[*]",), "Failed", Reason.RENDER_FAILED),
           Transition(("[*]",), "Failed", Reason.PYTORCHJOB_REJECTED), Transition(("[*]",), "Failed", Reason.NAME_CONFLICT))
def new_job(o: Observed, cfg) -> Plan | None:
    """A new job: create (or adopt) attempt 1's PyTorchJob, then Pending."""
    if o.status.phase is not None:
        return None
    return create_attempt(o, cfg, 1, "new_job")


def _spec_answered(o: Observed) -> bool:
    """The current generation was already judged (and refused: observedGeneration stays)."""
    c = o.status.condition(SPEC_ACCEPTED)
    return c is not None and c.observed_generation == o.generation


@situation(Transition(LIVE, "=", Reason.SPEC_APPLIED), Transition(LIVE, "=", Reason.IMMUTABLE_FIELD_CHANGED),
           Transition(LIVE, "=", Reason.INVALID_SPEC))
def spec_changed(o: Observed, cfg) -> Plan | None:
    """metadata.generation moved: only resilience, suspend and the checkpoint cadence may change
    (condition SpecAccepted; observedGeneration moves only when the change is accepted)."""
    if o.generation == o.status.observed_generation or _spec_answered(o):
        return None
    current = o.child(o.status.pytorch_job)
    if current is not None and current.spec_hash != spec_hash(o.raw_spec):
        # The CRD's CEL rules normally stop this at the API server; this catches a CRD without them.
        msg = ("only spec.resilience, spec.suspend and spec.checkpoint.intervalMinutes/keep may "
               "change while the job exists; the running attempt keeps its original spec")
        reason, ok = Reason.IMMUTABLE_FIELD_CHANGED, False
    elif o.spec is not None:
        msg, reason, ok = ("spec update applied (resilience and suspend now, checkpoint cadence "
                           "from the next attempt)", Reason.SPEC_APPLIED, True)
    else:
        msg, reason, ok = o.spec_error or "invalid spec", Reason.INVALID_SPEC, False
    update = {"conditions": _cond(o, _conds(o), SPEC_ACCEPTED, ok, reason, msg)}
    if ok:
        update["observedGeneration"] = max(o.generation or 0, o.status.observed_generation or 0)
    event = Event(False, Reason.SPEC_UPDATED, msg) if ok else Event(True, Reason.SPEC_CHANGE_REJECTED, msg)
    return Plan("spec_changed", status=update, events=(event,), outcome="updated" if ok else "invalid")


def _current(o: Observed):
    c = o.child(pytorchjob_name(o.name, o.attempt))
    return c if c is not None and c.owned else None


@situation()
def awaiting_watch(o: Observed, cfg) -> Plan | None:
    """Right after an operator start the jobs' events come before their PyTorchJobs': a recorded
    PyTorchJob not seen yet is waited for a little (its event queues the job) before one GET."""
    if o.awaiting_watch and _current(o) is None:
        return Plan("awaiting_watch", requeue=WATCH_WAIT, waiting=True)
    return None


@situation(Transition(("Suspended",), "Pending", Reason.RESUMED), Transition(("Suspended",), "Restarting", Reason.RESUMED))
def suspended(o: Observed, cfg) -> Plan | None:
    """Suspended: keep the PyTorchJob deleted; spec.suspend false again resumes as a new attempt
    that spends no restart."""
    if o.status.phase != Phase.SUSPENDED:
        return None
    current = _current(o)
    if o.raw_spec.get("suspend"):
        return Plan("suspended", delete=(current.name,) if current is not None and not current.deleting else ())
    if not o.status.pytorch_job:  # created suspended: attempt 1 never started
        return Plan("resumed", outcome="resumed", status={
            "phase": Phase.PENDING, "reason": Reason.RESUMED, "message": "spec.suspend is false: starting",
            "conditions": _cond(o, _conds(o), READY, False, Reason.PENDING, "waiting for the PyTorchJob to run")})
    return restart(o, "resumed", Reason.RESUMED, "spec.suspend is false", spend=False, outcome="resumed")


@situation(Transition(ANY_ACTIVE, "Suspended", Reason.SUSPENDED))
def suspend(o: Observed, cfg) -> Plan | None:
    """spec.suspend true: Suspended, the attempt's PyTorchJob deleted (its pods get their grace
    period, the trainer checkpoints on SIGTERM); the restart budget is kept."""
    if not o.raw_spec.get("suspend"):
        return None
    current = _current(o)
    msg = (f"spec.suspend is true: attempt {o.attempt} stopped (the trainer checkpoints on SIGTERM); "
           "the restart budget is kept; set it to false to resume from the newest checkpoint")
    return Plan("suspend", status={
        "phase": Phase.SUSPENDED, "reason": Reason.SUSPENDED, "message": msg, "nextAttemptTime": None,
        "conditions": _cond(o, _conds(o), READY, False, Reason.SUSPENDED, msg)},
        delete=(current.name,) if current is not None else (), events=(Event(False, Reason.SUSPENDED, msg),),
        outcome="suspended")


@situation(Transition(("Restarting",), "=", None))
def backoff(o: Observed, cfg) -> Plan | None:
    """The next attempt is due at status.nextAttemptTime (restart backoff): look again then."""
    if _current(o) is not None:
        return None
    due = parse_time(o.status.next_attempt_time)
    if due is not None and due > o.now:
        return Plan("backoff", requeue=(due - o.now).total_seconds() + 0.05)
    return None


@situation(Transition(ANY_ACTIVE, "=", Reason.CREATED), Transition(ANY_ACTIVE, "Failed", Reason.INVALID_SPEC),
           Transition(ANY_ACTIVE, "Failed", Reason.RENDER_FAILED),
           Transition(ANY_ACTIVE, "Failed", Reason.PYTORCHJOB_REJECTED),
           Transition(ANY_ACTIVE, "Failed", Reason.NAME_CONFLICT))
def missing_child(o: Observed, cfg) -> Plan | None:
    """Status names attempt N but its PyTorchJob does not exist (a restart, a crash between two
    steps, a PyTorchJob deleted by hand): create attempt N's."""
    if _current(o) is not None:
        return None
    if o.spec is None:
        return fail(o, "missing_child", Reason.INVALID_SPEC, o.spec_error or "invalid spec")
    return create_attempt(o, cfg, o.attempt, "missing_child")


def create_attempt(o: Observed, cfg: OperatorConfig, attempt: int, name: str) -> Plan:
    """Attempt N's PyTorchJob: render it and have act.py create (or adopt) it; decided again with
    what the create came to, the status update records it, conditionally on the snapshot that
    said attempt N (a write that finds the job moved on deletes what was created: act.py)."""
    ptj_name = pytorchjob_name(o.name, attempt)
    existing = o.child(ptj_name)
    created = o.created if o.created is not None and o.created.name == ptj_name else None
    if created is None and existing is not None and not existing.deleting:
        verb, rdzv = ("Adopted", existing.rendezvous_id) if existing.owned else (None, None)
    elif created is None:
        try:
            obj = render_pytorchjob(o.spec, o.name, o.namespace, attempt, o.uid, cfg.default_etcd_endpoint,
                                    resume_before_step=o.status.resume_before_step,
                                    avoid_nodes=o.status.avoid_nodes or ())  # nodes.py
        except (ValueError, TypeError, yaml.YAMLError) as err:  # what validation could not foresee
            return fail(o, name, Reason.RENDER_FAILED, f"cannot render the PyTorchJob of attempt {attempt}: {err}")
        obj["metadata"]["annotations"][SPEC_HASH] = spec_hash(o.raw_spec)
        return Plan(name, create=obj)
    elif created.outcome == "rejected":
        return fail(o, name, Reason.PYTORCHJOB_REJECTED,
                    f"the API server refused PyTorchJob {ptj_name}: {created.message}")
    else:
        verb = {"created": "Created", "adopted": "Adopted"}.get(created.outcome)
        rdzv = created.rendezvous_id
    if verb is None:
        return fail(o, name, Reason.NAME_CONFLICT,
                    f"a PyTorchJob named {ptj_name} already exists in {o.namespace} and "
                    "is not owned by this job; delete it or rename the job")
    update = {"attempt": attempt, "restarts": o.status.restarts or 0, "pytorchJob": ptj_name,
              "rendezvousId": rdzv or rendezvous_id(o.namespace, o.name, o.uid, attempt),
              "attemptCreationTime": timestamp(o.now), "nextAttemptTime": None}
    if o.status.phase is None:  # a new job
        conds = _validated_conditions(o, _conds(o))
        update.update(phase=Phase.PENDING, observedGeneration=o.generation, model=model_summary(o.spec.model),
                      plan=plan_status(o.spec),
                      conditions=_cond(o, conds, READY, False, Reason.PENDING, "waiting for the PyTorchJob to run"))
    message = f"{verb} PyTorchJob {ptj_name} (attempt {attempt})"
    return Plan(name, status=update, events=(Event(False, Reason(verb), message),), outcome=verb.lower())


@situation()
def child_deleting(o: Observed, cfg) -> Plan | None:
    """The current PyTorchJob is being deleted: wait for its DELETED event."""
    current = _current(o)
    if current is not None and current.deleting:
        return Plan("child_deleting")  # its DELETED event brings us back
    return None


@situation(Transition(ANY_ACTIVE, "Restarting", Reason.FAILED), Transition(ANY_ACTIVE, "Restarting", Reason.PREFLIGHT_FAILED),
           Transition(ANY_ACTIVE, "Failed", Reason.RESTART_BUDGET_EXHAUSTED))
def attempt_failed(o: Observed, cfg) -> Plan | None:
    """The current attempt's PyTorchJob failed: the next attempt, or Failed when the budget is
    spent. Its pods' failures (caught by the pod watch before the training-operator deleted the
    pods) say which nodes to blame and whether it was the preflight check."""
    current = _current(o)
    if current is None or current.state != "Failed":
        return None
    if o.failures is None:
        return Plan("attempt_failed", need="failures")
    st = o.status
    failed = forensics.failed_attempt(o.failures, current.failure_message, st.preflight_failures or 0)
    spent = failed.spend and (st.restarts or 0) >= resilience_of(o).max_restarts
    if not spent and needs_ready_nodes(o, failed.blamed):
        return Plan("attempt_failed", need="ready_nodes")

    def amend(update: dict) -> dict:
        avoid = forensics.amend_failed(update, failed, spec=o.spec, attempt=o.attempt,
                                       bad_nodes=o.raw_status.get("badNodes") or [],
                                       preflight_failures=st.preflight_failures or 0, ready=o.ready_nodes,
                                       when=timestamp(o.now))
        busbw = (failed.verdict or {}).get("busBandwidthGBps")
        return {"blamed": failed.blamed, "taint": tuple(b for b in failed.blamed if b["node"] in avoid),
                "preflight_busbw": busbw if isinstance(busbw, (int, float)) else None}

    return restart(o, "attempt_failed", failed.reason, failed.message, spend=failed.spend, amend=amend)


@situation(Transition(("Running", "Restarting"), "Pending", Reason.CREATED),
           Transition(("Pending", "Restarting"), "Running", Reason.RUNNING),
           Transition(("Pending", "Running"), "Restarting", Reason.RESTARTING),
           Transition(ANY_ACTIVE, "Succeeded", Reason.SUCCEEDED))
def follow(o: Observed, cfg) -> Plan | None:
    """Copy the PyTorchJob's (non-failed) state into the job's phase."""
    current = _current(o)
    if current is None or current.state is None or PHASE_OF[current.state] == o.status.phase:
        return None
    phase = PHASE_OF[current.state]
    message = f"PyTorchJob {current.name} is {current.state}"
    update: dict = {"phase": phase, "reason": current.state, "message": message,
                    "conditions": _cond(o, _conds(o), READY, phase in (Phase.RUNNING, Phase.SUCCEEDED),
                                        current.state, message)}
    if phase == Phase.RUNNING:
        update["startTime"] = o.status.start_time or timestamp(o.now)
        update["attemptStartTime"] = timestamp(o.now)
    if phase == Phase.SUCCEEDED:
        update["completionTime"] = timestamp(o.now)
    return Plan("follow", status=update, events=(Event(False, Reason(phase.value), message),))


@situation(Transition(("Pending", "Restarting"), "Restarting", Reason.STARTUP_TIMEOUT),
           Transition(("Pending", "Restarting"), "Failed", Reason.RESTART_BUDGET_EXHAUSTED))
def startup_timeout(o: Observed, cfg) -> Plan | None:
    """The attempt's pods did not all start within spec.resilience.startupTimeoutMinutes of its
    creation: the next attempt (restart spent), its message in the pods' own words."""
    if o.status.phase not in (Phase.PENDING, Phase.RESTARTING) or _current(o) is None:
        return None
    since = parse_time(o.status.attempt_creation_time)
    timeout = dt.timedelta(minutes=resilience_of(o).startup_timeout_minutes)
    if since is None or o.now - since <= timeout:
        return None
    problem = startup_problem(list(o.pods))
    why = problem[1] if problem else "no worker pod started"
    msg = f"the pods did not start within startupTimeoutMinutes {timeout.total_seconds() / 60:.0f}: {why}"
    return _restart_stuck(o, "startup_timeout", Reason.STARTUP_TIMEOUT, msg)


@situation(Transition(("Pending", "Restarting"), "=", Reason.UNSCHEDULABLE),
           Transition(("Pending", "Restarting"), "=", Reason.IMAGE_PULL_BACK_OFF))
def pods_stuck(o: Observed, cfg) -> Plan | None:
    """Pending: why the pods do not start, in their own words (status.message, a Warning event)."""
    if o.status.phase not in (Phase.PENDING, Phase.RESTARTING) or _current(o) is None:
        return None
    problem = startup_problem(list(o.pods))
    if problem is None or (o.status.reason, o.status.message) == problem:
        return None
    reason, message = problem
    return Plan("pods_stuck", status={"reason": reason, "message": message,
                                      "conditions": _cond(o, _conds(o), READY, False, reason, message)},
                events=(Event(True, Reason(reason), message),))


def _verdict(o: Observed) -> health.Verdict | None:
    if o.status.phase != Phase.RUNNING or _current(o) is None or o.spec is None:
        return None
    return health.evaluate(o.spec, o.raw_status, o.progress, o.now)


@situation(Transition(("Running",), "Restarting", Reason.HANG), Transition(("Running",), "Restarting", Reason.NO_FIRST_STEP),
           Transition(("Running",), "Restarting", Reason.NON_FINITE_LOSS), Transition(("Running",), "Restarting", Reason.LOSS_SPIKE),
           Transition(("Running",), "Failed", Reason.RESTART_BUDGET_EXHAUSTED))
def unhealthy(o: Observed, cfg) -> Plan | None:
    """A health rule (controller/health.py) calls for a restart of the Running attempt."""
    verdict = _verdict(o)
    if verdict is None or verdict.restart is None:
        return None
    r = verdict.restart
    return _restart_stuck(o, "unhealthy", r.reason, r.message,
                          then=lambda update: r.amend(o.generation, update, o.now))


@situation(Transition(("Running",), "=", Reason.NO_RECENT_CHECKPOINT), Transition(("Running",), "=", Reason.ROLLED_BACK))
def health_conditions(o: Observed, cfg) -> Plan | None:
    """The verdict's conditions changed, or the attempt applied the rollback it was asked for."""
    verdict = _verdict(o)
    if verdict is None:
        return None
    changed = health.changed_conditions(_conds(o), verdict)
    applied = verdict.rollback_applied is not None and o.status.resume_before_step == verdict.rollback_applied
    if not changed and not applied:
        return None
    conds = _conds(o)
    for c in changed:
        conds = _cond(o, conds, c.type, c.status, c.reason, c.message)
    events = [Event(True, c.reason, c.message) for c in changed if c.warn and c.status]
    update: dict = {"conditions": conds}
    if applied:
        update["resumeBeforeStep"] = None
        events.append(Event(False, Reason.ROLLED_BACK, (
            f"attempt {o.attempt} resumed from the newest checkpoint before step {verdict.rollback_applied}; "
            f"the later ones are kept under <checkpoint.uri>/quarantine/")))
    return Plan("health_conditions", status=update, events=tuple(events))


@situation()
def steady(o: Observed, cfg) -> Plan:
    """Nothing to change. On first sight (an operator restart) say once what was adopted."""
    phase = o.status.phase
    active = phase is not None and phase.active and _current(o) is not None
    plan = Plan("steady", requeue=cfg.progress_interval if active else None,
                monitor=active and phase == Phase.RUNNING)
    if not o.first_sight:
        return plan
    exists = o.child(o.status.pytorch_job) is not None
    events = (Event(False, Reason.ADOPTED, f"Adopted PyTorchJob {o.status.pytorch_job} (attempt {o.attempt})"),) \
        if exists and phase is not None and phase.active else ()
    return Plan("steady", requeue=plan.requeue, monitor=plan.monitor, events=events,
                outcome="adopted" if exists else "unchanged")


SITUATIONS: tuple[Situation, ...] = (
    terminal, new_invalid, new_suspended, new_job, spec_changed, awaiting_watch, suspended, suspend,
    backoff, missing_child, child_deleting, attempt_failed, follow, startup_timeout, pods_stuck,
    unhealthy, health_conditions, steady)


def decide(o: Observed, cfg: OperatorConfig) -> Plan:
    for rule in SITUATIONS:
        plan = rule(o, cfg)
        if plan is not None:
            return plan
    raise AssertionError("steady always applies")

"""The writes decide()'s situations share: Failed, the next attempt (restart), creating an
attempt's child (the job's backend's kind: llmtrain.backends). Pure, like decide.py: the time is the
snapshot's."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable

from ... import backends
from ...planner import plan_job
from ...pod_contract import child_name, rendezvous_id
from ...spec import LLMTrainingJobSpec, ResilienceSpec, model_summary
from ...status import STUCK, ConditionType, Phase, Reason
from . import checkpoint_status, forensics
from .child_status import set_condition
from .config import OperatorConfig
from .progress import timestamp
from .situation import kind
from .snapshot import Event, Observed, Plan

READY, VALIDATED, SPEC_ACCEPTED = ConditionType.READY, ConditionType.VALIDATED, ConditionType.SPEC_ACCEPTED
SPEC_HASH = "llmtrain.dev/spec-hash"
MUTABLE_SECTIONS = ("resilience", "checkpoint", "suspend")


# --- pure helpers --------------------------------------------------------------------------------


def spec_hash(raw_spec: dict) -> str:
    """Hash of the sections that shape the pods (everything but the mutable ones)."""
    fixed = {k: v for k, v in raw_spec.items() if k not in MUTABLE_SECTIONS}
    fixed["checkpoint.uri"] = (raw_spec.get("checkpoint") or {}).get("uri")
    return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:16]


def plan_status(spec: LLMTrainingJobSpec) -> dict:
    plan = plan_job(spec)
    return {
        "memoryPerGpuGiB": round(plan.total_bytes / 1024**3, 2),
        "fits": plan.fits,
        "flopsPerToken": float(plan.flops_per_token),
        "numParams": plan.num_params,
        "expectedTokensPerSecond": round(plan.tokens_per_second, 1),
    }


def restart_backoff(resilience, restarts: int, floor: float = OperatorConfig.min_restart_backoff) -> float:
    """Seconds before attempt N+1 after the `restarts`-th restart spent: restartBackoffSeconds,
    doubling with every restart already spent, at most maxRestartBackoffSeconds, at least the
    operator's floor (--min-restart-backoff-seconds: 0 made a crash loop)."""
    if isinstance(resilience, dict):  # the wire form (spec.resilience)
        first = float(resilience.get("restartBackoffSeconds", 10))
        cap = float(resilience.get("maxRestartBackoffSeconds", 300))
    else:
        first, cap = float(resilience.restart_backoff_seconds), float(resilience.max_restart_backoff_seconds)
    return max(floor, min(cap, first * 2 ** min(max(restarts, 0), 30)))


def resilience_of(o: Observed) -> ResilienceSpec:
    """The job's current spec.resilience (mutable: the newest generation's), defaults filled in."""
    if o.spec is not None:
        return o.spec.resilience
    try:
        return ResilienceSpec.model_validate(o.raw_spec.get("resilience") or {})
    except ValueError:
        return ResilienceSpec()


def conds_of(o: Observed) -> list[dict]:
    return list(o.raw_status.get("conditions") or [])


def cond(o: Observed, conds: list[dict], type_, ok: bool, reason: Reason | str, message: str) -> list[dict]:
    return set_condition(conds, type_, ok, reason, message, o.generation, o.now)


def failed_update(o: Observed, reason: Reason, message: str) -> dict:
    """The status update that marks a job Failed."""
    return {
        "phase": Phase.FAILED,
        "reason": reason,
        "message": message,
        "conditions": cond(o, conds_of(o), READY, False, reason, message),
        "completionTime": timestamp(o.now),
        "observedGeneration": o.generation,
    }


def fail(
    o: Observed, situation_name: str, reason: Reason, message: str, outcome: str | None = "invalid", **extra
) -> Plan:
    return Plan(
        situation_name,
        status=failed_update(o, reason, message),
        events=(Event(True, reason, message),),
        outcome=outcome,
        **extra,
    )


def restart(
    o: Observed,
    name: str,
    cause: Reason,
    message: str,
    *,
    spend: bool = True,
    floor: float = OperatorConfig.min_restart_backoff,
    amend: Callable[[dict], dict | None] | None = None,
    outcome: str | None = "restarted",
) -> Plan:
    """The next attempt (fresh rendezvous id, resumes from the newest checkpoint), or Failed when
    the restart budget is spent. `spend=False`: the new attempt does not count against
    maxRestarts and starts at once (it never trained through no fault of the job: a failed
    preflight, a resume after suspend). `amend(update)` adds the cause's own fields in place and
    may return the plan fields it implies (taints)."""
    st, r = o.status, resilience_of(o)
    restarts, attempt = st.restarts or 0, o.attempt
    old = st.current_child
    if spend and restarts >= r.max_restarts:
        update = failed_update(
            o,
            Reason.RESTART_BUDGET_EXHAUSTED,
            f"attempt {attempt} {cause.words}: {message}; {restarts} of {r.max_restarts} restarts used",
        )
        extra = (amend(update) if amend else None) or {}
        return Plan(
            name,
            status=update,
            delete=(old,) if old and cause in STUCK else (),
            events=(Event(True, Reason.RESTART_BUDGET_EXHAUSTED, update["message"]),),
            outcome=outcome,
            ended=cause,
            **{k: v for k, v in extra.items() if k != "taint"},
        )
    nxt = attempt + 1
    delay = restart_backoff(r, restarts, floor) if spend else 0.0
    due = o.now + dt.timedelta(seconds=delay)
    if due.microsecond:  # status times have whole seconds: round up, never start early
        due = due.replace(microsecond=0) + dt.timedelta(seconds=1)
    when = f"at {timestamp(due)} (restart backoff {delay:.0f} s)" if delay >= 1 else "now"
    update = {
        "phase": Phase.RESTARTING,
        "attempt": nxt,
        "restarts": restarts + (1 if spend else 0),
        "reason": cause,
        **child_fields(o, child_name(o.name, nxt)),
        "rendezvousId": rendezvous_id(o.namespace, o.name, o.uid, nxt),
        "attemptCreationTime": timestamp(due),
        "nextAttemptTime": timestamp(due) if delay >= 1 else None,
        "admissionTime": None,
        "message": f"attempt {attempt} {cause.words}: {message}; starting attempt {nxt} "
        f"{when} from the newest checkpoint",
        "conditions": cond(o, conds_of(o), READY, False, Reason.RESTARTING, f"attempt {attempt} {cause.words}"),
    }
    extra = (amend(update) if amend else None) or {}
    return Plan(
        name,
        status=update,
        delete=(old,) if old else (),
        events=(Event(True, Reason.RESTARTING, update["message"]),),
        outcome=outcome,
        restart=cause,
        **extra,
    )


def needs_ready_nodes(o: Observed, blamed=()) -> bool:
    return not o.ready_nodes_read and forensics.needs_ready_nodes(o.spec, blamed, o.raw_status.get("badNodes"))


def stuck_amend(o: Observed, cause: Reason, then: Callable[[dict], None] | None = None):
    def amend(update: dict) -> None:
        forensics.amend_stuck(
            update,
            cause,
            spec=o.spec,
            attempt=o.attempt,
            bad_nodes=o.raw_status.get("badNodes") or [],
            ready=o.ready_nodes,
        )
        if then is not None:
            then(update)

    return amend


def restart_stuck(
    o: Observed, name: str, cause: Reason, message: str, then=None, *, floor: float = OperatorConfig.min_restart_backoff
) -> Plan:
    st, r = o.status, resilience_of(o)
    if needs_ready_nodes(o) and not ((st.restarts or 0) >= r.max_restarts):
        return Plan(name, need="ready_nodes")
    return restart(o, name, cause, message, amend=stuck_amend(o, cause, then), outcome=None, floor=floor)


def validated_conditions(o: Observed, conds: list[dict]) -> list[dict]:
    return cond(o, conds, VALIDATED, True, Reason.SPEC_VALID, "the spec passed validation")


def child_fields(o: Observed, name: str) -> dict:
    """status.child (and status.backend, written once) for a new attempt's child; the field older
    operators wrote instead (status.pytorchJob) is cleared, so that it never names an old attempt."""
    out: dict = {"child": name}
    if not o.status.backend:
        out["backend"] = o.backend
    if "pytorchJob" in o.raw_status:
        out["pytorchJob"] = None
    return out


def create_attempt(o: Observed, cfg: OperatorConfig, attempt: int, name: str) -> Plan:
    """Attempt N's child: render it and have act.py create (or adopt) it; decided again with what
    the create came to, the status update records it, conditionally on the snapshot that said
    attempt N (a write that finds the job moved on deletes what was created: act.py)."""
    child = child_name(o.name, attempt)
    what = kind(o)
    existing = o.child(child)
    created = o.created if o.created is not None and o.created.name == child else None
    if o.spec is not None and o.spec.checkpoint.auto and o.spec.checkpoint.uri and not o.node_mtbf_read:
        return Plan(name, need="node_mtbf")  # the interval it starts with (controller/policy/checkpoint_status.py)
    if created is None and existing is not None and not existing.deleting:
        verb, rdzv = ("Adopted", existing.rendezvous_id) if existing.owned else (None, None)
    elif created is None:
        assert o.spec is not None  # attempts start only for a valid spec
        try:
            obj = backends.get(o.backend).render(
                o.spec,
                o.name,
                o.namespace,
                attempt,
                o.uid,
                cfg.default_etcd_endpoint,
                resume_before_step=o.status.resume_before_step,
                avoid_nodes=o.status.avoid_nodes or (),  # nodes.py
                rendezvous_credentials=bool(cfg.rendezvous_ca_dir),
                cadence_inputs=checkpoint_status.render_inputs(o),
            )
        except backends.RENDER_ERRORS as err:  # what validation could not foresee
            return fail(o, name, Reason.RENDER_FAILED, f"cannot render the {what} of attempt {attempt}: {err}")
        obj["metadata"]["annotations"][SPEC_HASH] = spec_hash(o.raw_spec)
        return Plan(name, create=obj)
    elif created.outcome == "rejected":
        return fail(o, name, Reason.ATTEMPT_REJECTED, f"the API server refused {what} {child}: {created.message}")
    elif created.outcome == "not-served":
        return fail(o, name, Reason.BACKEND_NOT_INSTALLED, not_installed(o, cfg))
    else:
        verb = {"created": "Created", "adopted": "Adopted"}.get(created.outcome)
        rdzv = created.rendezvous_id
    if verb is None:
        return fail(
            o,
            name,
            Reason.NAME_CONFLICT,
            f"a {what} named {child} already exists in {o.namespace} and "
            "is not owned by this job; delete it or rename the job",
        )
    update = {
        "attempt": attempt,
        "restarts": o.status.restarts or 0,
        **child_fields(o, child),
        "rendezvousId": rdzv or rendezvous_id(o.namespace, o.name, o.uid, attempt),
        "attemptCreationTime": timestamp(o.now),
        "nextAttemptTime": None,
        "admissionTime": None,
    }
    checkpoint = checkpoint_status.at_creation(o, attempt)
    if checkpoint is not None:
        update["checkpoint"] = checkpoint
    if o.is_new:
        assert o.spec is not None  # attempts start only for a valid spec
        conds = validated_conditions(o, conds_of(o))
        update.update(
            phase=Phase.PENDING,
            observedGeneration=o.generation,
            model=model_summary(o.spec.model),
            plan=plan_status(o.spec),
            conditions=cond(o, conds, READY, False, Reason.PENDING, f"waiting for the {what} to run"),
        )
    message = f"{verb} {what} {child} (attempt {attempt})"
    return Plan(name, status=update, events=(Event(False, Reason(verb), message),), outcome=verb.lower())


def not_installed(o: Observed, cfg: OperatorConfig) -> str:
    """Why a job's backend cannot run here, and what to change: the CRD, and the setting that chose it."""
    b = backends.get(o.backend)
    spec_backend = o.spec.cluster.backend if o.spec is not None else None
    if spec_backend:
        chose = f"spec.cluster.backend is {b.name}: set it to another backend the platform installed"
    elif o.backend == cfg.namespace_backends.get(o.namespace):
        chose = (
            f"the namespace's default backend is {b.name}: change the operator chart's "
            f"backends.namespaceDefaults.{o.namespace}, or set spec.cluster.backend"
        )
    else:
        chose = f"the platform's default backend is {b.name}: change the operator chart's backends.default"
    return (
        f"the {b.child.kind} CRD ({b.child.crd}) is not installed in this cluster, so no attempt can start: "
        f"install {b.installs}, or remove {b.name} from the chart's backends.enabled; {chose}"
    )

"""What a failed or stuck attempt leaves behind, folded into the restart that follows it. Pure: the
pod failures (podfailure.py, caught by the pod watch in nodes.py) and the Ready nodes come in the snapshot.

- `failed_attempt`: the child (PyTorchJob, JobSet) of an attempt turned Failed. Tells a failed preflight
  (preflight.py) from a training failure: the restart's reason, message, whether it spends the
  restart budget, and the nodes to blame.
- `amend_failed` / `amend_stuck`: the fields the restart writes in the same conditional write:
  status.badNodes / avoidNodes / preflight / flightRecorder, and the message's suffixes. A hang or
  start-up timeout names where the NCCL flight recorder dumped the stuck collectives
  (pod_contract.flight_recorder_location), and plans the nodes to avoid again against the nodes Ready
  now (an attempt that could not start because too few nodes were left gets them back).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...catalog import instance_type
from ...pod_contract import flight_recorder_location
from ...spec import LLMTrainingJobSpec
from ...status import DUMPS, Phase, Reason
from . import badnodes, podfailure, preflight


def flight_recorder_status(spec: LLMTrainingJobSpec | None, attempt: int, reason: Reason) -> dict | None:
    if spec is None or not instance_type(spec.cluster.instance_type).is_gpu:
        return None  # gloo on CPU has no flight recorder
    where, persistent = flight_recorder_location(spec, attempt)
    return {
        "attempt": attempt,
        "reason": reason.words,
        "path": f"{where}/rank_<rank>",
        "persistent": persistent,
        "note": (
            "beside the checkpoints"
            if persistent
            else "on each pod's node-local staging volume: gone with the pod; the PyTorchJob or JobSet "
            "of a hung attempt is deleted at the restart"
        ),
    }


@dataclass(frozen=True)
class FailedAttempt:
    reason: Reason
    message: str
    spend: bool
    blamed: tuple[dict, ...]
    verdict: dict | None
    collective_timeout: bool


def failed_attempt(
    failures: tuple[dict, ...], ptj_message: str, preflight_failures: int, ran: frozenset[str] = frozenset()
) -> FailedAttempt:
    """The restart that a failed attempt calls for, from its pods' failures (only the pods of the
    attempt's own child: anyone can label a pod like a worker). `ran`: the nodes the
    attempt's pods ran on, as the API says."""
    seen = list(failures)
    ignored: list[str] = []
    verdict = preflight.preflight_verdict(seen, ignored)
    if verdict is not None:
        # The verdict is the tenant's text: it may only blame nodes this attempt's pods ran on.
        blamed = preflight.suspect_failures(verdict, seen, {f["node"] for f in seen} | set(ran))
        reason = Reason.PREFLIGHT_FAILED
        message = preflight.message(verdict, [b["node"] for b in blamed])
        spend = preflight_failures >= preflight.MAX_FREE_RETRIES
    else:
        blamed, reason, spend = podfailure.culprits(seen), Reason.FAILED, True
        message = ptj_message
        if seen:
            message += "; " + ", ".join(_said(f) for f in seen[:3])
    if ignored:  # said in the restart's Warning event and status.message, never raised
        message += f"; preflight verdict ignored ({ignored[0]})"
    timeout = any(podfailure.is_collective_timeout(f.get("message")) for f in seen) or podfailure.is_collective_timeout(
        ptj_message
    )
    return FailedAttempt(reason, message, spend, tuple(blamed), verdict, timeout)


def _said(failure: dict) -> str:
    """One failed pod in a restart's message: its classified reason, then (quoted: the tenant's
    text) the root cause's own words, which name what failed (a path, a value)."""
    said = f"pod {failure['pod']} on node {failure['node']}: {failure['reason']}"
    detail = podfailure.root_cause_detail(failure.get("message"))
    return f'{said} ("{detail}")' if detail else said


def needs_ready_nodes(spec: LLMTrainingJobSpec | None, blamed, bad_nodes) -> bool:
    return spec is not None and bool(blamed or bad_nodes)


def _avoid(update: dict, bad: list[dict], ready, spec: LLMTrainingJobSpec | None) -> list[str]:
    needed = spec.cluster.nodes if spec is not None else 0
    avoid, why = badnodes.plan_avoidance(bad, set(ready) if ready is not None else None, needed)
    update["avoidNodes"] = avoid
    if why:
        update["message"] += f"; {why}"
    return avoid


def amend_failed(
    update: dict,
    failed: FailedAttempt,
    *,
    spec,
    attempt: int,
    bad_nodes: list[dict],
    preflight_failures: int,
    ready,
    when: str,
) -> list[str]:
    """Add the failure's forensics to the restart `update` (in place); returns the nodes avoided."""
    bad = badnodes.record(bad_nodes, list(failed.blamed), attempt, when)
    if bad:
        update["badNodes"] = bad
    if failed.verdict is not None:
        update["preflight"] = preflight.summary(failed.verdict, attempt, when, [b["node"] for b in failed.blamed])
        update["preflightFailures"] = preflight_failures + 1
    if failed.collective_timeout:
        fr = flight_recorder_status(spec, attempt, Reason.COLLECTIVE_TIMEOUT)
        if fr is not None:
            update["flightRecorder"] = fr
            update["message"] += f"; NCCL flight recorder dumps: {fr['path']}"
    if update.get("phase") == Phase.RESTARTING:
        return _avoid(update, bad, ready, spec)
    return []


def amend_stuck(update: dict, reason: Reason, *, spec, attempt: int, bad_nodes: list[dict], ready) -> None:
    """Add to a hang / start-up timeout / health restart `update` (in place): the flight recorder's
    dumps, and the nodes to avoid planned again."""
    fr = flight_recorder_status(spec, attempt, reason) if reason in DUMPS else None
    if fr is not None:
        update["flightRecorder"] = fr
        update["message"] = f"{update['message']}; NCCL flight recorder dumps: {fr['path']}"
    if update.get("phase") == Phase.RESTARTING and bad_nodes and spec is not None:
        _avoid(update, bad_nodes, ready, spec)

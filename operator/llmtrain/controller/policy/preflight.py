"""The preflight health check's verdict, as the operator reads it from a failed worker pod.

`python -m llmtrain_trainer.launch` runs `healthcheck` on every rank before training (when
spec.resilience.preflight is on: pod_contract.worker_env sets LLMTRAIN_PREFLIGHT). If the nodes are
unfit it exits PREFLIGHT_EXIT_CODE with the check's compact JSON verdict as the container's
termination message, so the verdict survives in the pod's terminated state (which nodes.pod_event
catches before the training-operator deletes the pod) without anyone scraping logs:

  {"event": "healthcheck", "healthy": false, "busBandwidthGBps": 1.2, "expectedBusBandwidthGBps": 400,
   "degraded": false, "suspectNodes": [{"node": 1, "host": "<pod>", "nodeName": "<k8s node>"}],
   "suspectRanks": {"8": ["links ... below 50% of the median of the other links ..."]}, ...}

What the operator does with it (forensics.py): the suspect nodes go to status.badNodes with reason
"preflight: ...", the next attempt avoids them, status.preflight records the measurement (and the
llmtrain_operator_preflight_bus_bandwidth_gbps gauge), and the restart does not spend the job's
restart budget: the attempt never trained. The first MAX_FREE_RETRIES failed checks of a job are
free (status.preflightFailures counts them), so a job whose every node fails the check still ends
(by the budget) instead of looping.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from ...pod_contract import PREFLIGHT_EXIT_CODE

MAX_FREE_RETRIES = 3
MAX_SUSPECTS = 64  # suspect nodes (and ranks) read from one verdict
MAX_MESSAGE_CHARS = 4096  # the kubelet keeps 4 KiB of a termination message


class InvalidVerdict(ValueError):
    """A termination message that says it is a healthcheck verdict but is not a well-formed one."""


_Name = Annotated[str, StringConstraints(max_length=253)]


class _Typed(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class SuspectNode(_Typed):
    node: int | None = None
    host: _Name | None = None
    nodeName: _Name | None = None
    problem: Annotated[str, StringConstraints(max_length=1000)] | None = None


class Verdict(_Typed):
    """The fields of the trainer's verdict the operator reads (trainer/llmtrain_trainer/distributed/healthcheck.py),
    typed and bounded: the message is the tenant's container's, and a field of the wrong type used
    to raise in the restart decision, which the work queue then retried forever."""

    event: Literal["healthcheck"]
    healthy: bool
    degraded: bool = False
    busBandwidthGBps: float | None = Field(None, allow_inf_nan=False)
    expectedBusBandwidthGBps: float | None = Field(None, allow_inf_nan=False)
    worldSize: int | None = Field(None, ge=0)
    suspectNodes: list[SuspectNode] = Field(default_factory=list, max_length=MAX_SUSPECTS)
    suspectRanks: dict[
        Annotated[str, StringConstraints(max_length=16)],
        Annotated[list[Annotated[str, StringConstraints(max_length=1000)]], Field(max_length=16)],
    ] = Field(default_factory=dict, max_length=MAX_SUSPECTS)


def verdict_of(message: str | None) -> dict | None:
    """The healthcheck verdict in a termination message (its typed fields), or None if the message
    is not one; InvalidVerdict if it says it is one but its fields do not type-check."""
    text = (message or "").strip()[:MAX_MESSAGE_CHARS]
    start = text.find("{")
    if start < 0:
        return None
    try:
        raw = json.loads(text[start:])
    except ValueError:
        return None
    if not isinstance(raw, dict) or raw.get("event") != "healthcheck":
        return None
    try:
        return Verdict.model_validate(raw).model_dump(exclude_none=True)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(the verdict)"
        raise InvalidVerdict(f"{where}: {first['msg']}") from None


def preflight_verdict(failures: list[dict], ignored: list[str] | None = None) -> dict | None:
    """The first failing verdict among an attempt's pod failures (every node writes the same one).
    A malformed one is skipped; why goes to `ignored` ("pod <name>: <field>: <problem>")."""
    for f in failures:
        if f.get("exitCode") == PREFLIGHT_EXIT_CODE:
            try:
                verdict = verdict_of(f.get("message"))
            except InvalidVerdict as err:
                if ignored is not None:
                    ignored.append(f"pod {f.get('pod')}: {err}")
                continue
            if verdict is not None and not verdict.get("healthy", True):
                return verdict
    return None


def suspect_failures(verdict: dict, failures: list[dict], ran: set[str]) -> list[dict]:
    """The verdict's suspect nodes as failures (node = the Kubernetes node): by the node name the
    trainer read from the downward API, else by its pod name (HOSTNAME) among the seen failures.
    Only nodes in `ran` (where the attempt's own pods ran, as the API says) can be blamed: the
    verdict is text the tenant's container wrote, and could name any node."""
    node_of_pod = {f["pod"]: f["node"] for f in failures}
    problems = verdict.get("suspectRanks") or {}
    first_problem = next((p[0] for p in problems.values() if p), None)
    out = []
    for s in verdict.get("suspectNodes") or []:
        node = s.get("nodeName") or node_of_pod.get(s.get("host"))
        if not node or node not in ran:
            continue
        why = s.get("problem") or first_problem or "failed the health check"
        out.append(
            {"node": node, "pod": s.get("host"), "exitCode": PREFLIGHT_EXIT_CODE, "reason": f"preflight: {why}"[:200]}
        )
    return out


def summary(verdict: dict, attempt: int, when: str, nodes: list[str]) -> dict:
    """status.preflight for a verdict."""
    out = {
        "attempt": attempt,
        "healthy": bool(verdict.get("healthy")),
        "time": when,
        "suspectNodes": nodes,
        "degraded": bool(verdict.get("degraded")),
    }
    for src, dst in (
        ("busBandwidthGBps", "busBandwidthGBps"),
        ("expectedBusBandwidthGBps", "expectedBusBandwidthGBps"),
        ("worldSize", "worldSize"),
    ):
        if verdict.get(src) is not None:
            out[dst] = verdict[src]
    return out


def message(verdict: dict, nodes: list[str]) -> str:
    bw = verdict.get("busBandwidthGBps")
    exp = verdict.get("expectedBusBandwidthGBps")
    parts = ["the preflight health check failed"]
    if nodes:
        parts.append(f"suspect node(s) {', '.join(nodes)}")
    if bw is not None:
        parts.append(f"all-reduce bus bandwidth {bw} GB/s" + (f" (expected {exp} GB/s)" if exp else ""))
    return "; ".join(parts)

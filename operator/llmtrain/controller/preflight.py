"""The preflight health check's verdict, as the operator reads it from a failed worker pod.

`python -m llmtrain_trainer.launch` runs `healthcheck` on every rank before training (when
spec.resilience.preflight is on; render.py sets LLMTRAIN_PREFLIGHT). If the nodes are unfit it
exits PREFLIGHT_EXIT_CODE with the check's compact JSON verdict as the container's termination
message, so the verdict survives in the pod's terminated state (which nodes.pod_event catches before
the training-operator deletes the pod) without anyone scraping logs:

  {"event": "healthcheck", "healthy": false, "busBandwidthGBps": 1.2, "expectedBusBandwidthGBps": 400,
   "degraded": false, "suspectNodes": [{"node": 1, "host": "<pod>", "nodeName": "<k8s node>"}],
   "suspectRanks": {"8": ["links ... below 50% of the median link ..."]}, ...}

What the operator does with it (forensics.py): the suspect nodes go to status.badNodes with reason
"preflight: ...", the next attempt avoids them, status.preflight records the measurement (and the
llmtrain_operator_preflight_bus_bandwidth_gbps gauge), and the restart does not spend the job's
restart budget: the attempt never trained. The first MAX_FREE_RETRIES failed checks of a job are
free (status.preflightFailures counts them), so a job whose every node fails the check still ends
(by the budget) instead of looping.
"""

from __future__ import annotations

import json

from ..render import PREFLIGHT_EXIT_CODE

MAX_FREE_RETRIES = 3


def verdict_of(message: str | None) -> dict | None:
    """The healthcheck verdict in a termination message, or None if it is not one."""
    text = (message or "").strip()
    start = text.find("{")
    if start < 0:
        return None
    try:
        verdict = json.loads(text[start:])
    except ValueError:
        return None
    if not isinstance(verdict, dict) or verdict.get("event") != "healthcheck":
        return None
    return verdict


def preflight_verdict(failures: list[dict]) -> dict | None:
    """The first failing verdict among an attempt's pod failures (every node writes the same one)."""
    for f in failures:
        if f.get("exitCode") == PREFLIGHT_EXIT_CODE:
            verdict = verdict_of(f.get("message"))
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
        out.append({"node": node, "pod": s.get("host"), "exitCode": PREFLIGHT_EXIT_CODE,
                    "reason": f"preflight: {why}"[:200]})
    return out


def summary(verdict: dict, attempt: int, when: str, nodes: list[str]) -> dict:
    """status.preflight for a verdict."""
    out = {"attempt": attempt, "healthy": bool(verdict.get("healthy")), "time": when,
           "suspectNodes": nodes, "degraded": bool(verdict.get("degraded"))}
    for src, dst in (("busBandwidthGBps", "busBandwidthGBps"),
                     ("expectedBusBandwidthGBps", "expectedBusBandwidthGBps"), ("worldSize", "worldSize")):
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

"""The decide table's situations about the nodes under the current attempt: a node the cluster
says is sick (a watched node condition False: sicknodes.py) moves the attempt away (tried before
`follow`, so that an attempt on a sick node is moved whatever its child says meanwhile); a node
whose rank makes the others wait (slownodes.py) is reported, and replaced when that pays (tried
after the health rules, before `steady`)."""

from __future__ import annotations

from ...status import ConditionType, Phase, Reason
from . import badnodes, sicknodes, slownodes
from .progress import timestamp
from .situation import ANY_ACTIVE, Transition, current_child, situation
from .snapshot import Event, Observed, Plan
from .writes import cond, conds_of, resilience_of, restart


@situation(
    Transition(ANY_ACTIVE, "Restarting", Reason.NODE_UNHEALTHY),
    Transition(ANY_ACTIVE, "Failed", Reason.RESTART_BUDGET_EXHAUSTED),
)
def sick_node(o: Observed, cfg) -> Plan | None:
    """A watched condition is False on a node holding a pod of the current attempt: the next
    attempt, away from the node, from the newest checkpoint (the deleted child's pods save one on
    SIGTERM within their grace period). No restart is spent for the first cfg.free_node_moves
    moves (status.nodeMoves); later ones spend the budget, which bounds a flapping node."""
    current = current_child(o)
    if not o.sick_nodes or current is None or current.suspended or current.deleting or o.spec is None:
        return None
    if o.status.phase not in (Phase.PENDING, Phase.RUNNING, Phase.RESTARTING) or current.state == "Failed":
        return None  # a failed child is attempt_failed's: its pods' own failures say more
    moves = o.raw_status.get("nodeMoves") or 0
    free = moves < cfg.free_node_moves
    spent = not free and (o.status.restarts or 0) >= resilience_of(o).max_restarts
    if not spent and not o.ready_nodes_read:
        return Plan("sick_node", need="ready_nodes")  # the next attempt avoids the node while enough remain
    sick = o.sick_nodes
    message = "; ".join(s.words() for s in sick[:3]) + (f" (and {len(sick) - 3} more)" if len(sick) > 3 else "")
    if not free:
        message += f"; {moves} moves off sick nodes already made without spending a restart"

    def amend(update: dict) -> dict:
        if update.get("phase") == Phase.RESTARTING:
            update["nodeMoves"] = moves + 1
        blamed = sicknodes.amend_move(
            update,
            sick,
            attempt=o.attempt,
            bad_nodes=o.raw_status.get("badNodes") or [],
            ready=o.ready_nodes,
            needed=o.spec.cluster.nodes if o.spec is not None else 0,
            when=timestamp(o.now),
        )
        return {"blamed": blamed}

    return restart(
        o, "sick_node", Reason.NODE_UNHEALTHY, message, spend=not free, amend=amend, floor=cfg.min_restart_backoff
    )


STRAGGLER = ConditionType.STRAGGLER_DETECTED


def _condition(o: Observed) -> dict | None:
    return next((c for c in conds_of(o) if c.get("type") == STRAGGLER.value), None)


@situation(
    Transition(("Running",), "=", Reason.STRAGGLER),
    Transition(("Running",), "=", Reason.REPLACE_DECLINED),
    Transition(("Running",), "=", Reason.NO_STRAGGLER),
    Transition(("Running",), "Restarting", Reason.STRAGGLER),
)
def slow_node(o: Observed, cfg) -> Plan | None:
    """Rank 0 reports a straggler on one of the attempt's nodes (score at spec.resilience.
    stragglers.threshold): condition StragglerDetected naming the node and the slowdown, a Warning
    event, status.straggler (since when). With action replace, once it lasted durationMinutes: a
    restart away from the node (no restart spent; at most maxReplacements) when the time saved
    beats the restart's cost (slownodes.payoff), else a ReplaceDeclined event saying the sums.
    When no rank is one any more: the condition False."""
    current = current_child(o)
    if o.status.phase != Phase.RUNNING or current is None or o.spec is None or o.progress is None:
        return None
    spec = resilience_of(o).stragglers
    recorded = o.raw_status.get("straggler")
    s = slownodes.found(o.progress.stragglers, spec, o.pod_nodes)
    if s is None:
        if not recorded or (o.progress.stragglers is None and recorded.get("attempt") == o.attempt):
            return None  # nothing recorded, or a scrape without the series: nothing new either way
        msg = (
            f"no rank is a straggler any more (the last was rank {recorded.get('rank')} on node {recorded.get('node')})"
        )
        return Plan(
            "slow_node",
            status={"straggler": None, "conditions": cond(o, conds_of(o), STRAGGLER, False, Reason.NO_STRAGGLER, msg)},
            events=(Event(False, Reason.NO_STRAGGLER, msg),),
        )
    slow_for = slownodes.lasted(recorded, s, o.attempt, o.now)
    if not slownodes.same(recorded, s, o.attempt):
        new = slow_for.total_seconds() == 0
        update: dict = {
            "straggler": {
                "attempt": o.attempt,
                "rank": s.rank,
                "node": s.node,
                "score": round(s.score, 2),
                "slowdown": round(s.slowdown, 2),
                "since": timestamp(o.now) if new or not recorded else recorded.get("since"),
            }
        }
        if new:  # a new straggler (or node): the condition and the event say so; drifting figures do not
            update["conditions"] = cond(o, conds_of(o), STRAGGLER, True, Reason.STRAGGLER, s.words())
        return Plan("slow_node", status=update, events=(Event(True, Reason.STRAGGLER, s.words()),) if new else ())
    if spec.action != "replace" or slow_for.total_seconds() < spec.duration_minutes * 60:
        return None
    replacements = o.raw_status.get("stragglerReplacements") or 0
    pay = slownodes.payoff(o.raw_status, s.slowdown, o.now)
    if replacements >= spec.max_replacements:
        why = f"not replacing node {s.node}: {replacements} of maxReplacements {spec.max_replacements} made"
    elif pay is None:
        why = f"not replacing node {s.node}: no estimate of the time remaining (training.maxSteps and a step time)"
    elif not pay.pays:
        why = f"not replacing node {s.node}: {pay.words()}"
    else:
        why = ""
    if why:
        c = _condition(o)
        if c is not None and c.get("reason") == Reason.REPLACE_DECLINED.value:
            return None  # said once
        return Plan(
            "slow_node",
            status={
                "conditions": cond(o, conds_of(o), STRAGGLER, True, Reason.REPLACE_DECLINED, f"{s.words()}; {why}")
            },
            events=(Event(False, Reason.REPLACE_DECLINED, why),),
        )
    assert pay is not None
    if not o.ready_nodes_read:
        return Plan("slow_node", need="ready_nodes")  # the next attempt avoids the node while enough remain
    message = f"replacing node {s.node}: {pay.words()}; {s.words()} for {slownodes.duration(slow_for.total_seconds())}"

    def amend(update: dict) -> dict:
        update["stragglerReplacements"] = replacements + 1
        update["straggler"] = None
        update["conditions"] = cond(
            o, update["conditions"], STRAGGLER, False, Reason.STRAGGLER, f"attempt {o.attempt} moved off node {s.node}"
        )
        bad = badnodes.record(
            o.raw_status.get("badNodes") or [],
            [{"node": s.node, "reason": f"straggler {s.slowdown:.2f}x slowdown", "message": s.words()}],
            o.attempt,
            timestamp(o.now),
        )
        update["badNodes"] = bad
        needed = o.spec.cluster.nodes if o.spec is not None else 0
        avoid, avoid_why = badnodes.plan_avoidance(
            bad, set(o.ready_nodes) if o.ready_nodes is not None else None, needed
        )
        update["avoidNodes"] = avoid
        if avoid_why:
            update["message"] += f"; {avoid_why}"
        return {"blamed": ({"node": s.node, "reason": "straggler"},)}

    return restart(o, "slow_node", Reason.STRAGGLER, message, spend=False, amend=amend, floor=cfg.min_restart_backoff)

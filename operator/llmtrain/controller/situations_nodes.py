"""The decide table's situations about the nodes under the current attempt: a node the cluster
says is sick (a watched node condition False: sicknodes.py) moves the attempt away. Tried before
`follow`, so that an attempt on a sick node is moved whatever its child says meanwhile."""

from __future__ import annotations

from ..status import Phase, Reason
from . import sicknodes
from .situation import ANY_ACTIVE, Transition, current_child, situation
from .snapshot import Observed, Plan
from .status import timestamp
from .transitions import resilience_of, restart


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

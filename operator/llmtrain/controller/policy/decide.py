"""decide(observed, config) -> Plan: the job's state machine, as one pure function.

No I/O, no clock (the snapshot's `now`), no globals, no kopf or kubernetes: no module it reaches
performs I/O (tests/operator_core/test_decide_purity.py). It is the only code that sets
status.phase, attempt, restarts, reason and the conditions, and act.write_status the only code
that writes them (tests/operator_core/test_status_writers.py). It is a table of situations, each a
small function that returns a Plan when it applies (None otherwise), tried in order; the first one
that applies decides. A new situation (a Kueue admission, a goodput fact) is a new function and
a row in SITUATIONS, and the state diagram (docs/reference/state-machine.md) is generated from
the rows' `Transition`s (scripts/gen-state-diagram.py). The plan is the row's: what follows it is
read from its fields, never from its name (status.goodput, accounting.py: from the write and
`ended`, `restart`, `outcome`, `periodic`).

The situations live by lifecycle stage, each module in the table's order: situations_start.py
(terminal, a new job, an edited spec, awaiting the watch), situations_attempt.py (suspend and
resume, the restart backoff, a missing, deleting or failed child), situations_kueue.py
(preempted, queued, admitted), situations_nodes.py (a sick node under the attempt) and
situations_running.py (following the child, pods that do
not start, the health verdicts, steady); situation.py holds what they share.

Every plan then gets its amendments, each in a module of its own: the end of a job (ending.py:
the trainer's final progress, no ETA), goodput (accounting.py) and the checkpoint cadence
(cadence.py).

Invariants (tests/operator_core/test_decide_properties.py checks them over random histories):
  * status.attempt and status.restarts never go down; a restart raises attempt by one;
  * restarts never exceed spec.resilience.maxRestarts: beyond it the job is Failed;
  * a terminal phase (Succeeded, Failed) stays;
  * attempt N's child (its backend's kind) is created only from a snapshot that says attempt N and
    has none.
"""

from __future__ import annotations

from . import accounting, ending
from .config import OperatorConfig
from .situation import Situation, Transition
from .situations_attempt import attempt_failed, backoff, child_deleting, missing_child, suspend, suspended
from .situations_kueue import admitted, preempted, queued
from .situations_nodes import sick_node, slow_node
from .situations_running import follow, health_conditions, pods_stuck, startup_timeout, steady, unhealthy
from .situations_start import awaiting_watch, new_invalid, new_job, new_suspended, spec_changed, terminal
from .snapshot import Observed, Plan
from .writes import SPEC_HASH, restart_backoff, spec_hash

__all__ = ["SITUATIONS", "SPEC_HASH", "Transition", "decide", "restart_backoff", "spec_hash"]


SITUATIONS: tuple[Situation, ...] = (
    terminal,
    new_invalid,
    new_suspended,
    new_job,
    spec_changed,
    awaiting_watch,
    suspended,
    suspend,
    backoff,
    missing_child,
    child_deleting,
    attempt_failed,
    preempted,
    queued,
    admitted,
    sick_node,
    follow,
    startup_timeout,
    pods_stuck,
    unhealthy,
    health_conditions,
    slow_node,
    steady,
)


def decide(o: Observed, cfg: OperatorConfig) -> Plan:
    for rule in SITUATIONS:
        plan = rule(o, cfg)
        if plan is not None:
            if plan.need is not None or plan.create is not None:
                return plan
            plan = ending.amend(o, plan)  # a write that ends the job: final progress, no ETA
            if plan.need is not None:
                return plan
            # status.goodput follows the row's write (its one writer: accounting.py), from plan fields
            return accounting.amend(o, plan, cfg)
    raise AssertionError("steady always applies")

"""The decide table's first stage (situations_start.py): a terminal job, a new job (created, adopted,
invalid, suspended), an edited spec, and the operator's own restart (awaiting the watch)."""

from __future__ import annotations

import pytest

from llmtrain.controller.policy.progress import timestamp
from llmtrain.controller.policy.snapshot import CreateResult

from .decide_cases import ABSENT, Case, all_of, assert_decision, cond, message_has, ready_is
from .decide_world import NOW, decide_, pending, ptj, running, snap, tiny
from .test_decide_attempt import ATTEMPT_CASES
from .test_decide_kueue import KUEUE_CASES
from .test_decide_nodes import SICK_CASES, SLOW_CASES
from .test_decide_running import RUNNING_CASES

START_CASES = [
    # --- a new job ---
    Case("new job: render attempt 1 and create it", snap(), "new_job", create="j-a1"),
    Case(
        "new job: created → Pending, attempt 1, restarts 0",
        snap(created=CreateResult("j-a1", "created", rendezvous_id="ns-j-01234567-a1")),
        "new_job",
        status={
            "phase": "Pending",
            "attempt": 1,
            "restarts": 0,
            "child": "j-a1",
            "rendezvousId": "ns-j-01234567-a1",
            "observedGeneration": 1,
            "model": "tiny",
            "attemptCreationTime": timestamp(NOW),
            "nextAttemptTime": None,
        },
        events=[(False, "Created")],
        outcome="created",
        check=all_of(ready_is("False", "Pending"), lambda p: cond(p.status, "Validated")["status"] == "True"),
    ),
    Case(
        "new job: the create found it (409) → adopted, not duplicated",
        snap(created=CreateResult("j-a1", "adopted", rendezvous_id="ns-j-01234567-a1")),
        "new_job",
        status={"phase": "Pending", "attempt": 1},
        events=[(False, "Adopted")],
        outcome="adopted",
    ),
    Case(
        "new job: its PyTorchJob already in the cache → adopted without a create",
        snap(children=[ptj(1)]),
        "new_job",
        status={"phase": "Pending", "child": "j-a1"},
        events=[(False, "Adopted")],
        outcome="adopted",
    ),
    Case(
        "new job: a PyTorchJob of that name owned by another → Failed NameConflict",
        snap(children=[ptj(1, owned=False)]),
        "new_job",
        status={"phase": "Failed", "reason": "NameConflict"},
        events=[(True, "NameConflict")],
        outcome="invalid",
    ),
    Case(
        "new job: the create answered a PyTorchJob owned by another → NameConflict",
        snap(created=CreateResult("j-a1", "not-owned")),
        "new_job",
        status={"phase": "Failed", "reason": "NameConflict"},
        events=[(True, "NameConflict")],
    ),
    Case(
        "new job: the API server refused the PyTorchJob → Failed AttemptRejected",
        snap(created=CreateResult("j-a1", "rejected", "admission webhook denied")),
        "new_job",
        status={"phase": "Failed", "reason": "AttemptRejected"},
        events=[(True, "AttemptRejected")],
        check=message_has("refused PyTorchJob j-a1", "admission webhook denied"),
    ),
    Case(
        "new job: invalid spec → Failed InvalidSpec, no PyTorchJob",
        snap(spec=tiny(model={"preset": "no-such-model"})),
        "new_invalid",
        status={"phase": "Failed", "reason": "InvalidSpec", "observedGeneration": 1, "completionTime": timestamp(NOW)},
        events=[(True, "InvalidSpec")],
        outcome="invalid",
        check=ready_is("False", "InvalidSpec"),
    ),
    Case(
        "new job created suspended → Suspended, attempt 1, no PyTorchJob",
        snap(spec=tiny(suspend=True)),
        "new_suspended",
        status={"phase": "Suspended", "attempt": 1, "restarts": 0, "reason": "Suspended"},
        events=[(False, "Suspended")],
        outcome="suspended",
    ),
    # --- terminal ---
    Case(
        "Succeeded stays Succeeded",
        snap({"phase": "Succeeded", "attempt": 1}, children=[ptj(1, "Succeeded")]),
        "terminal",
    ),
    Case(
        "Failed stays Failed, whatever its PyTorchJob does",
        snap({"phase": "Failed", "attempt": 2}, children=[ptj(2, "Running")]),
        "terminal",
    ),
    Case(
        "a terminal job on first sight is counted unchanged",
        snap({"phase": "Failed", "attempt": 1}, first_sight=True),
        "terminal",
        outcome="unchanged",
    ),
    # --- spec changes ---
    Case(
        "a mutable field changed → SpecAccepted True, observedGeneration moves",
        snap(running(), spec=tiny(resilience={"maxRestarts": 3}), generation=2, children=[ptj(1, "Running")]),
        "spec_changed",
        status={"observedGeneration": 2},
        events=[(False, "SpecUpdated")],
        outcome="updated",
        check=lambda p: cond(p.status, "SpecAccepted")["reason"] == "Applied",
    ),
    Case(
        "an immutable field changed (no CEL) → refused, observedGeneration stays",
        snap(running(), spec=tiny(training={"maxSteps": 99}), generation=2, children=[ptj(1, "Running")]),
        "spec_changed",
        status={"observedGeneration": ABSENT},
        events=[(True, "SpecChangeRejected")],
        outcome="invalid",
        check=lambda p: cond(p.status, "SpecAccepted")["reason"] == "ImmutableFieldChanged",
    ),
    Case(
        "a mutable change that makes the spec invalid → refused InvalidSpec",
        snap(
            running(),
            spec=tiny(resilience={"maxRestarts": -1}),
            generation=2,
            children=[ptj(1, "Running", raw_spec=tiny(resilience={"maxRestarts": -1}))],
        ),
        "spec_changed",
        check=lambda p: cond(p.status, "SpecAccepted")["reason"] == "InvalidSpec",
    ),
    Case(
        "a refused generation is not judged again",
        snap(
            running(
                conditions=[
                    {
                        "type": "SpecAccepted",
                        "status": "False",
                        "reason": "ImmutableFieldChanged",
                        "observedGeneration": 2,
                    },
                    {"type": "TrainingHealthy", "status": "True", "reason": "StepsCompleting"},
                ]
            ),
            spec=tiny(training={"maxSteps": 99}),
            generation=2,
            children=[ptj(1, "Running")],
        ),
        "steady",
    ),
    # --- README: the operator dies (restart, failover): nothing twice, nothing back ---
    Case(
        "first sight after an operator restart: adopt, say so once, write nothing",
        snap(running(), children=[ptj(1, "Running")], first_sight=True),
        "steady",
        events=[(False, "Adopted")],
        outcome="adopted",
    ),
    Case(
        "right after the start, a recorded PyTorchJob not seen yet is waited for, not created",
        snap(running(), first_sight=True, awaiting_watch=True),
        "awaiting_watch",
        requeue=1.0,
        check=lambda p: p.waiting,
    ),
    Case(
        "the recorded PyTorchJob is really gone (deleted by hand): attempt N is created again",
        snap(running(attempt=2, restarts=1)),
        "missing_child",
        create="j-a2",
    ),
    Case(
        "its PyTorchJob is being deleted: wait for the DELETED event",
        snap(running(), children=[ptj(1, "Running", deleting=True)]),
        "child_deleting",
    ),
    Case(
        "an older attempt's failure is not this attempt's",
        snap(pending(attempt=2, restarts=1), children=[ptj(1, "Failed"), ptj(2, "Created")]),
        "steady",
    ),
    Case(
        "a PyTorchJob of the current name owned by another is not ours to follow",
        snap(running(), children=[ptj(1, "Failed", owned=False)]),
        "missing_child",
        status={"phase": "Failed", "reason": "NameConflict"},
    ),
    Case(
        "the render cannot handle the operator's default etcd endpoint → Failed RenderFailed",
        snap(),
        "new_job",
        status={"phase": "Failed", "reason": "RenderFailed"},
        events=[(True, "RenderFailed")],
        check=message_has("cannot render the PyTorchJob of attempt 1"),
    ),
]
# the whole table, every stage's cases: what test_the_table_covers_every_situation... counts
CASES = START_CASES + ATTEMPT_CASES + RUNNING_CASES + KUEUE_CASES + SICK_CASES + SLOW_CASES


@pytest.mark.parametrize("case", START_CASES, ids=[c.id for c in START_CASES])
def test_decide(case: Case):
    assert_decision(case)


def test_the_table_covers_every_situation_and_has_60_cases():
    from llmtrain.controller.policy.decide import SITUATIONS

    covered = {c.situation for c in CASES}
    named = {s.__name__ for s in SITUATIONS} | {"resumed"}
    assert named - covered == set(), named - covered
    assert len(CASES) >= 60


def test_a_phase_this_version_cannot_read_is_not_a_new_job():
    """A status written by a newer operator (a phase added later) must never restart the job at
    attempt 1: the snapshot reads what it can, and no new-job situation applies."""
    o = snap(
        {"phase": "Queued", "attempt": 3, "restarts": 2, "child": "j-a3", "observedGeneration": 1},
        children=[ptj(3, "Created")],
    )
    plan = decide_(o)
    assert plan.situation not in ("new_job", "new_invalid", "new_suspended") and plan.create is None
    assert not plan.status or plan.status.get("attempt", 3) >= 3

"""The operator's pure status rules: Kubeflow conditions → state, conditions, progress, hang."""

import datetime as dt

from prometheus_client import CollectorRegistry, generate_latest

from llmtrain.backends.pytorchjob import state_of as pytorchjob_state
from llmtrain.controller.policy.child_status import progress_from_metrics, set_condition


def _ptj(*conds):
    return {
        "status": {
            "conditions": [
                {"type": t, "status": s, "lastTransitionTime": f"2026-01-01T00:00:0{i}Z"}
                for i, (t, s) in enumerate(conds)
            ]
        }
    }


def test_state_is_the_latest_true_condition_and_terminal_ones_win():
    assert pytorchjob_state({}) is None
    assert pytorchjob_state(_ptj(("Created", "True"))) == "Created"
    assert pytorchjob_state(_ptj(("Created", "True"), ("Running", "True"))) == "Running"
    assert pytorchjob_state(_ptj(("Created", "True"), ("Running", "False"), ("Failed", "True"))) == "Failed"
    # Kubeflow keeps Created True for ever; Succeeded must still win over it
    assert pytorchjob_state(_ptj(("Succeeded", "True"), ("Created", "True"))) == "Succeeded"


def test_condition_transition_time_moves_only_when_status_changes():
    t0, t1 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC), dt.datetime(2026, 1, 1, 0, 5, tzinfo=dt.UTC)
    conds = set_condition([], "Ready", False, "Pending", "waiting", None, t0)
    first = conds[0]["lastTransitionTime"]
    conds[0]["lastTransitionTime"] = "2000-01-01T00:00:00Z"
    same = set_condition(conds, "Ready", False, "StillPending", "still waiting", None, t1)
    assert same[0]["lastTransitionTime"] == "2000-01-01T00:00:00Z" and same[0]["reason"] == "StillPending"
    flipped = set_condition(same, "Ready", True, "Running", "running", None, t1)
    assert flipped[0]["status"] == "True" and flipped[0]["lastTransitionTime"] == "2026-01-01T00:05:00Z"
    assert first == "2026-01-01T00:00:00Z" and len(set_condition(flipped, "Validated", True, "ok", "ok", None, t1)) == 2


def test_progress_is_read_from_the_trainers_own_exposition():
    from llmtrain_trainer.metrics.prometheus import TrainerMetrics

    m = TrainerMetrics(CollectorRegistry(), job="j", rank=0)
    m.step.set(7)
    m.loss.set(3.25)
    m.tokens_per_second.set(100.0)
    m.mfu.set(0.5)
    m.last_checkpoint_step.set(5)
    m.heartbeat_timestamp_seconds.set(1_700_000_000)
    p = progress_from_metrics(generate_latest(m.registry).decode())
    assert (p.step, p.loss, p.tokens_per_second, p.mfu, p.last_checkpoint_step) == (7, 3.25, 100.0, 0.5, 5)
    assert p.as_status()["heartbeatTime"] == "2023-11-14T22:13:20Z"

"""The decide table's running stage (situations_running.py): following the child's state, pods that do
not start (their words, the start-up timeout), the health rules (hang, NaN, loss spike, checkpoints)."""

from __future__ import annotations

import datetime as dt

import pytest

from llmtrain.controller.policy.progress import Progress, timestamp
from llmtrain.status import Reason

from .decide_cases import (
    ABSENT,
    AT_37,
    BUDGET1,
    GPU_FILE,
    Case,
    all_of,
    assert_decision,
    cond,
    healthy_is,
    message_has,
    only_the_eta_removed,
    progress_is,
    ready_is,
)
from .decide_world import NOW, ago, decide_, gpu, pending, pod, ptj, running, snap, tiny

# the demo's 40-step job ended at step 40: the final summary its pods left (AT_37: its last scrape)
FINAL_40 = Progress(
    step=40,
    loss=2.25,
    tokens_per_second=1500.0,
    mfu=0.1085,
    heartbeat=NOW.timestamp() - 3,
    attempt_steps=40,
    attempt_step_seconds=80.0,
    last_checkpoint_step=40,
)


def goodput_closed_at(**expected):
    def check(plan):
        (record,) = plan.status["goodput"]["attempts"]
        assert record.get("endTime") == timestamp(NOW)
        for key, value in expected.items():
            assert record.get(key) == value, (key, record.get(key), value)

    return check


NAN = Progress(
    step=60,
    heartbeat=NOW.timestamp() - 5,
    nonfinite_loss_steps=3,
    nonfinite_loss_max_steps=3,
    nonfinite_loss_first_step=41,
)
SPIKE = Progress(step=300, heartbeat=NOW.timestamp() - 5, loss_spike_step=290, loss_spike_ratio=5.0)
STUCK_POD = pod(unschedulable="0/16 nodes are available: 16 Insufficient vpc.amazonaws.com/efa.")
PULL_POD = pod(waiting=("pytorch", "ImagePullBackOff", 'Back-off pulling image "nope:1"'))
# what a real kubelet says for imagePullPolicy Never and an image the node does not hold
NEVER_PULL_POD = pod(
    waiting=("pytorch", "ErrImageNeverPull", 'Container image "nope:1" is not present with pull policy of Never')
)

RUNNING_CASES = [
    # --- following the PyTorchJob ---
    Case(
        "Pending while the PyTorchJob is only Created",
        snap(pending(), children=[ptj(1, "Created")]),
        "steady",
        requeue=30.0,
    ),
    Case(
        "Pending → Running when the PyTorchJob runs",
        snap(pending(), children=[ptj(1, "Running")]),
        "follow",
        status={
            "phase": "Running",
            "reason": "Running",
            "attemptStartTime": timestamp(NOW),
            "startTime": timestamp(NOW),
        },
        events=[(False, "Running")],
        check=ready_is("True", "Running"),
    ),
    Case(
        "Running → Succeeded: first the trainer's final summary from the pods",
        snap(running(), children=[ptj(1, "Succeeded")]),
        "follow",
        need="final",
    ),
    Case(
        "Running → Succeeded",
        snap(running(), children=[ptj(1, "Succeeded")], final_read=True),
        "follow",
        status={"phase": "Succeeded", "completionTime": timestamp(NOW)},
        events=[(False, "Succeeded")],
        check=ready_is("True", "Succeeded"),
    ),
    Case(
        "Succeeded with the trainer's final summary: its step, loss, tokens/s and MFU, no ETA, "
        "and the attempt's goodput record closed with its counters",
        snap(running(progress=AT_37), children=[ptj(1, "Succeeded")], final=FINAL_40, final_read=True),
        "follow",
        status={"phase": "Succeeded", "completionTime": timestamp(NOW)},
        events=[(False, "Succeeded")],
        check=all_of(
            progress_is(
                step=40,
                loss=2.25,
                tokensPerSecond=1500.0,
                mfu=0.1085,
                mfuPercent="10.85%",
                attemptSteps=40,
                stepSeconds=80.0,
                heartbeatTime=ago(seconds=3),
                lastCheckpointStep=40,
                updateTime=timestamp(NOW),
                estimatedRemainingSeconds=None,
                estimatedCompletionTime=None,
            ),
            goodput_closed_at(step=40, attemptSteps=40, stepSeconds=80.0, endReason="Succeeded"),
        ),
    ),
    Case(
        "Succeeded without a final summary (an older trainer, pods gone): the last scrape stays, no ETA",
        snap(running(progress=AT_37), children=[ptj(1, "Succeeded")], final_read=True),
        "follow",
        status={"phase": "Succeeded"},
        check=all_of(
            progress_is(estimatedRemainingSeconds=None, estimatedCompletionTime=None),
            only_the_eta_removed,
        ),
    ),
    Case(
        "the final summary replaces an earlier attempt's scrape, not mixed into it",
        snap(
            running(attempt=2, restarts=1, progress={**AT_37, "attempt": 1}),
            children=[ptj(2, "Succeeded")],
            final=FINAL_40,
            final_read=True,
        ),
        "follow",
        status={"phase": "Succeeded"},
        check=progress_is(step=40, attempt=2, lossMedian=None, estimatedCompletionTime=None),
    ),
    Case(
        "Running → Restarting while the training-operator restarts a pod",
        snap(running(), children=[ptj(1, "Restarting")]),
        "follow",
        status={"phase": "Restarting"},
    ),
    Case("a suspended PyTorchJob (Kueue) is Pending", snap(pending(), children=[ptj(1, "Suspended")]), "steady"),
    Case(
        "a second Running keeps the first startTime",
        snap(pending(attempt=2, restarts=1, startTime=ago(hours=3)), children=[ptj(2, "Running")]),
        "follow",
        status={"startTime": ago(hours=3), "attemptStartTime": timestamp(NOW)},
    ),
    Case(
        "Running and healthy: look again after the progress interval, scrape rank 0",
        snap(running(), children=[ptj(1, "Running")]),
        "steady",
        requeue=30.0,
        check=lambda p: p.monitor,
    ),
    # --- README: the pods never start ---
    Case(
        "Pending, a pod unschedulable → the scheduler's words in status and a Warning",
        snap(pending(), children=[ptj(1, "Created")], pods=(STUCK_POD,)),
        "pods_stuck",
        status={
            "reason": "Unschedulable",
            "message": "pod j-a1-worker-0: 0/16 nodes are available: 16 Insufficient vpc.amazonaws.com/efa.",
        },
        events=[(True, "Unschedulable")],
        check=ready_is("False", "Unschedulable"),
    ),
    Case(
        "Pending, image pull failing → the kubelet's reason",
        snap(pending(), children=[ptj(1, "Created")], pods=(PULL_POD,)),
        "pods_stuck",
        status={"reason": "ImagePullBackOff"},
        events=[(True, "ImagePullBackOff")],
        check=message_has('container pytorch: ImagePullBackOff: Back-off pulling image "nope:1"'),
    ),
    Case(
        "Pending, pull policy Never and the image not on the node → the kubelet's reason, naming the image",
        snap(pending(), children=[ptj(1, "Created")], pods=(NEVER_PULL_POD,)),
        "pods_stuck",
        status={"reason": "ErrImageNeverPull"},
        events=[(True, "ErrImageNeverPull")],
        check=message_has('ErrImageNeverPull: Container image "nope:1" is not present'),
    ),
    Case(
        "start-up timeout waiting for an image → Failed in the kubelet's words, no restart spent, child deleted",
        snap(pending(attemptCreationTime=ago(minutes=31)), children=[ptj(1, "Created")], pods=(PULL_POD,)),
        "startup_timeout",
        status={"phase": "Failed", "reason": "ImagePullBackOff"},
        delete=("j-a1",),
        events=[(True, "ImagePullBackOff")],
        check=all_of(
            message_has('Back-off pulling image "nope:1"', "a new attempt would wait for the same image"),
            lambda p: p.restart is None and "restarts" not in p.status and "attempt" not in p.status,
        ),
    ),
    Case(
        "...and the same for an image the node may never pull",
        snap(pending(attemptCreationTime=ago(minutes=31)), children=[ptj(1, "Created")], pods=(NEVER_PULL_POD,)),
        "startup_timeout",
        status={"phase": "Failed", "reason": "ErrImageNeverPull"},
        delete=("j-a1",),
    ),
    Case(
        "the same start-up problem already recorded: nothing to write",
        snap(
            pending(
                reason="Unschedulable",
                message="pod j-a1-worker-0: 0/16 nodes are available: 16 Insufficient vpc.amazonaws.com/efa.",
            ),
            children=[ptj(1, "Created")],
            pods=(STUCK_POD,),
        ),
        "steady",
    ),
    Case(
        "a pod merely creating its container is no problem",
        snap(pending(), children=[ptj(1, "Created")], pods=(pod(waiting=("pytorch", "ContainerCreating", "")),)),
        "steady",
    ),
    Case(
        "startupTimeoutMinutes passed → Restarting StartupTimeout, restart spent, attempt 1 deleted",
        snap(pending(attemptCreationTime=ago(minutes=31)), children=[ptj(1, "Created")]),
        "startup_timeout",
        status={"phase": "Restarting", "attempt": 2, "restarts": 1, "reason": "StartupTimeout"},
        delete=("j-a1",),
        restart=Reason.STARTUP_TIMEOUT,
        check=message_has("did not start within startupTimeoutMinutes 30: no worker pod started"),
    ),
    Case(
        "the start-up timeout names the pods' own reason",
        snap(pending(attemptCreationTime=ago(minutes=31)), children=[ptj(1, "Created")], pods=(STUCK_POD,)),
        "startup_timeout",
        status={"reason": "StartupTimeout"},
        check=message_has("Insufficient vpc.amazonaws.com/efa"),
    ),
    Case(
        "not yet at the start-up deadline: no restart",
        snap(pending(attemptCreationTime=ago(minutes=29)), children=[ptj(1, "Created")]),
        "steady",
    ),
    Case(
        "the start-up timeout with the budget spent → Failed, the stuck PyTorchJob deleted",
        snap(
            pending(restarts=1, attemptCreationTime=ago(minutes=31)),
            spec=BUDGET1,
            children=[ptj(1, "Created", raw_spec=BUDGET1)],
        ),
        "startup_timeout",
        status={"phase": "Failed", "reason": "RestartBudgetExhausted"},
        delete=("j-a1",),
    ),
    Case(
        "a start-up timeout of a GPU job names the flight recorder (beside a file:// checkpoint)",
        snap(
            pending(attemptCreationTime=ago(minutes=31)), spec=GPU_FILE, children=[ptj(1, "Created", raw_spec=GPU_FILE)]
        ),
        "startup_timeout",
        check=lambda p: (
            p.status["flightRecorder"]
            == {
                "attempt": 1,
                "reason": "startup-timeout",
                "persistent": True,
                "note": "beside the checkpoints",
                "path": "/mnt/fsx/ckpt/j/flight-recorder/attempt-1/rank_<rank>",
            }
        ),
    ),
    Case(
        "a stuck attempt with bad nodes plans avoidance again (needs the Ready nodes)",
        snap(
            pending(
                attempt=2,
                restarts=1,
                attemptCreationTime=ago(minutes=31),
                badNodes=[{"node": "n1", "reason": "XID 79", "attempt": 1}],
                avoidNodes=["n1"],
            ),
            spec=gpu(),
            children=[ptj(2, "Created", raw_spec=gpu())],
        ),
        "startup_timeout",
        need="ready_nodes",
    ),
    Case(
        "...and gives the avoided node back when too few are Ready",
        snap(
            pending(
                attempt=2,
                restarts=1,
                attemptCreationTime=ago(minutes=31),
                badNodes=[{"node": "n1", "reason": "XID 79", "attempt": 1}],
                avoidNodes=["n1"],
            ),
            spec=gpu(),
            children=[ptj(2, "Created", raw_spec=gpu())],
            ready_nodes_read=True,
            ready_nodes=frozenset({"n1", "n2"}),
        ),
        "startup_timeout",
        status={"attempt": 3, "avoidNodes": []},
    ),
    # --- README: the job hangs ---
    Case(
        "no step for hangTimeoutMinutes → Restarting Hang, TrainingHealthy False",
        snap(
            running(attemptStartTime=ago(minutes=40), progress={"heartbeatTime": ago(minutes=31), "step": 50}),
            children=[ptj(1, "Running")],
        ),
        "unhealthy",
        status={"phase": "Restarting", "attempt": 2, "restarts": 1, "reason": "Hang"},
        delete=("j-a1",),
        restart=Reason.HANG,
        check=all_of(healthy_is("False", "Hang"), message_has("no training step completed")),
    ),
    Case(
        "a step 29 minutes ago is no hang (hangTimeoutMinutes 30)",
        snap(running(progress={"heartbeatTime": ago(minutes=29), "step": 50}), children=[ptj(1, "Running")]),
        "steady",
    ),
    Case(
        "a hang with the budget spent → Failed, the hung PyTorchJob deleted",
        snap(
            running(restarts=1, attemptStartTime=ago(minutes=40), progress={"heartbeatTime": ago(minutes=31)}),
            spec=BUDGET1,
            children=[ptj(1, "Running", raw_spec=BUDGET1)],
        ),
        "unhealthy",
        status={"phase": "Failed", "reason": "RestartBudgetExhausted"},
        delete=("j-a1",),
        check=healthy_is("False", "Hang"),
    ),
    Case(
        "a hang of a GPU job names where the NCCL flight recorder dumped",
        snap(
            running(attemptStartTime=ago(minutes=40), progress={"heartbeatTime": ago(minutes=31)}),
            spec=GPU_FILE,
            children=[ptj(1, "Running", raw_spec=GPU_FILE)],
        ),
        "unhealthy",
        check=lambda p: (
            p.status["flightRecorder"]["reason"] == "hang" and "flight-recorder/attempt-1" in p.status["message"]
        ),
    ),
    Case(
        "no first step within firstStepTimeoutMinutes → NoFirstStep",
        snap(
            running(attemptStartTime=ago(minutes=46), progress={}),
            spec=tiny(resilience={"firstStepTimeoutMinutes": 45}),
            children=[ptj(1, "Running", raw_spec=tiny(resilience={"firstStepTimeoutMinutes": 45}))],
        ),
        "unhealthy",
        status={"reason": "NoFirstStep", "attempt": 2},
        restart=Reason.NO_FIRST_STEP,
        check=healthy_is("False", "NoFirstStep"),
    ),
    # --- README: loss NaN/Inf, loss spike, stale checkpoint ---
    Case(
        "3 NaN losses in a row → NonFiniteLoss, resume before the first bad step",
        snap(running(), children=[ptj(1, "Running")], progress=NAN),
        "unhealthy",
        status={"reason": "NonFiniteLoss", "attempt": 2, "resumeBeforeStep": 41},
        restart=Reason.NON_FINITE_LOSS,
        check=healthy_is("False", "NonFiniteLoss"),
    ),
    Case(
        "NaN losses with the budget spent → Failed, nothing left to roll back",
        snap(running(restarts=1), spec=BUDGET1, children=[ptj(1, "Running", raw_spec=BUDGET1)], progress=NAN),
        "unhealthy",
        status={"phase": "Failed", "resumeBeforeStep": ABSENT},
        delete=("j-a1",),
    ),
    Case(
        "a loss spike is ignored while lossSpikeFactor is unset (the default)",
        snap(running(), children=[ptj(1, "Running")], progress=SPIKE),
        "steady",
    ),
    Case(
        "a loss spike with lossSpikeFactor → LossSpike, roll back before the spike",
        snap(
            running(),
            spec=tiny(resilience={"lossSpikeFactor": 3.0}, checkpoint={"uri": "file:///ck/"}),
            children=[
                ptj(1, "Running", raw_spec=tiny(resilience={"lossSpikeFactor": 3.0}, checkpoint={"uri": "file:///ck/"}))
            ],
            progress=SPIKE,
        ),
        "unhealthy",
        status={"reason": "LossSpike", "resumeBeforeStep": 290},
        restart=Reason.LOSS_SPIKE,
    ),
    Case(
        "no checkpoint for 2 × intervalMinutes → CheckpointStale and a Warning, no restart",
        snap(
            running(attemptStartTime=ago(minutes=11), progress={"heartbeatTime": ago(seconds=5)}),
            spec=tiny(checkpoint={"uri": "file:///ck/", "intervalMinutes": 5}),
            children=[ptj(1, "Running", raw_spec=tiny(checkpoint={"uri": "file:///ck/", "intervalMinutes": 5}))],
            progress=Progress(step=9, heartbeat=NOW.timestamp() - 5),
        ),
        "health_conditions",
        events=[(True, "NoRecentCheckpoint")],
        check=lambda p: cond(p.status, "CheckpointStale")["status"] == "True" and "phase" not in p.status,
    ),
    Case(
        "the attempt applied the rollback → resumeBeforeStep cleared, RolledBack event",
        snap(
            running(
                attempt=2,
                restarts=1,
                resumeBeforeStep=41,
                conditions=[{"type": "TrainingHealthy", "status": "True", "reason": "StepsCompleting"}],
            ),
            children=[ptj(2, "Running")],
            progress=Progress(step=45, heartbeat=NOW.timestamp() - 5, resumed_before_step=41),
        ),
        "health_conditions",
        status={"resumeBeforeStep": None},
        events=[(False, "RolledBack")],
    ),
    Case(
        "steps completing again after a NaN restart → TrainingHealthy True",
        snap(
            running(
                attempt=2,
                restarts=1,
                conditions=[{"type": "TrainingHealthy", "status": "False", "reason": "NonFiniteLoss"}],
            ),
            children=[ptj(2, "Running")],
        ),
        "health_conditions",
        check=healthy_is("True", "StepsCompleting"),
    ),
]


@pytest.mark.parametrize("case", RUNNING_CASES, ids=[c.id for c in RUNNING_CASES])
def test_decide(case: Case):
    assert_decision(case)


def test_decide_reads_no_clock():
    """The same snapshot decides the same, whenever: `now` comes from the snapshot."""
    o = snap(pending(attemptCreationTime=ago(minutes=31)), children=[ptj(1, "Created")])
    assert decide_(o) == decide_(o)
    later_o = o.with_(now=NOW + dt.timedelta(minutes=5))
    assert decide_(later_o).status["attemptCreationTime"] != decide_(o).status["attemptCreationTime"]

"""In-memory snapshots (spec.checkpoint.memory) on real torchrun workers (gloo, CPU).

- A worker SIGKILLed mid-run: torchrun restarts both workers in place and they resume from their own
  snapshots (tier "memory"), not from the durable checkpoint (there is none yet: it would be step 0).
- A whole node lost (its torchrun killed, its snapshot folder gone): a new node joins the same
  rendezvous, and the lost node's ranks resume from the copies their partners kept (tier "partner").

In both, the steps redone after the restart must be bit-identical to the ones the first workers
computed: the restored state is exactly the snapshot's, and the data position and RNG with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest

from conftest import base_spec

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

STEPS, EVERY = 40, 5


def _spec(tmp_path, **over) -> dict:
    return base_spec(
        **{
            "training.maxSteps": STEPS,
            "checkpoint.uri": f"file://{tmp_path}/ckpt",
            "checkpoint.memory": {"intervalSteps": EVERY},
            **over,
        }
    )


def _generations(events: list[dict]) -> list[dict[int, float]]:
    """Each worker generation's logged losses (a `config` event starts one)."""
    gens: list[dict[int, float]] = []
    for e in events:
        if e.get("event") == "config":
            gens.append({})
        elif e.get("event") == "step" and gens:
            gens[-1][e["step"]] = e["loss"]
    return gens


def _until_step(nodes, step: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not any(e.get("event") == "step" and e["step"] >= step for n in nodes for e in list(n.events)):
        assert time.monotonic() < deadline, "\n".join(n.stderr() for n in nodes)
        assert all(n.proc.poll() is None for n in nodes), "\n".join(n.stderr() for n in nodes)
        time.sleep(0.05)


def _assert_redone_bitwise(first: dict[int, float], second: dict[int, float], resumed: int) -> None:
    redone = sorted(s for s in second if s in first)
    assert redone and redone[0] == resumed + 1, (resumed, redone)
    assert [second[s] for s in redone] == [first[s] for s in redone]  # bit-identical, not approx


def test_a_killed_worker_resumes_from_its_own_snapshot(launch, tmp_path):
    snaps = tmp_path / "snapshots"
    w = launch(_spec(tmp_path), 2, max_restarts=1, env={"LLMTRAIN_SNAPSHOT_DIR": str(snaps)})
    w.wait_for(lambda e: e.get("event") == "step" and e["step"] >= 17)
    os.kill(w.worker(1), signal.SIGKILL)
    assert w.wait(240) == 0, w.stderr()

    (resume,) = w.of("resume")
    assert resume["tier"] == "memory" and resume["moved_ranks"] == 0, resume
    assert resume["step"] % EVERY == 0 and resume["step"] >= 15, resume
    first, second = _generations(w.events)
    _assert_redone_bitwise(first, second, resume["step"])
    assert max(second) == STEPS
    # each rank's two slots, each committed (its header beside it)
    assert sorted(p.name for p in snaps.iterdir()) == [
        f"rank-{r}.slot-{x}{ext}" for r in (0, 1) for x in ("a", "b") for ext in ("", ".json")
    ]


def test_a_lost_node_is_replaced_and_its_rank_restores_from_the_partner_copy(launch, tmp_path, etcd):
    spec = _spec(tmp_path, **{"rendezvous.backend": "etcd-v2", "cluster.processesPerNode": 1})
    folders = [tmp_path / "node-a", tmp_path / "node-b"]
    rdzv = ("etcd-v2", etcd)
    kw = dict(rdzv=rdzv, nnodes=2, max_restarts=1, rdzv_id=f"mem-{os.getpid()}-{tmp_path.name}"[:60])
    a = launch(spec, 1, name="a", env={"LLMTRAIN_SNAPSHOT_DIR": str(folders[0])}, **kw)
    b = launch(spec, 1, name="b", env={"LLMTRAIN_SNAPSHOT_DIR": str(folders[1])}, **kw)
    # rank 0, which logs the steps, is on whichever node the rendezvous made it
    _until_step([a, b], 17)
    # the node is gone: its processes, and its /dev/shm with them
    b.kill()
    shutil.rmtree(folders[1])
    b2 = launch(spec, 1, name="b2", env={"LLMTRAIN_SNAPSHOT_DIR": str(folders[1])}, **kw)
    assert a.wait(240) == 0, a.stderr()
    assert b2.wait(60) == 0, b2.stderr()

    # rank 0 logs: on whichever node it runs in each round
    events = a.events + b.events + b2.events
    resumes = [e for e in events if e.get("event") == "resume"]
    assert len(resumes) == 1 and resumes[0]["tier"] == "partner" and resumes[0]["moved_ranks"] == 1, resumes
    step = resumes[0]["step"]
    assert step % EVERY == 0 and step >= 15
    gens = _generations(b.events + a.events) + _generations(b2.events)
    first = next(g for g in gens if g and min(g) == 1 and max(g) > step)
    second = next(g for g in gens if g and min(g) == step + 1)
    _assert_redone_bitwise(first, second, step)
    assert max(second) == STEPS

"""The trainer's straggler timing (llmtrain_trainer/metrics/stragglers.py) on real
torch.distributed: 3 gloo processes train a small model under FSDP2 (fully_shard, as the trainer
wraps its blocks), one of them slowed by a sleep in its compute. The timed collectives put the
victims' waiting in their wait, not their compute, so rank 0's window names the slow rank and its
node, and the victims score below the threshold. (The trainer's own multi-rank run with its
test-only slow hook is the end-to-end proof; this pins the measurement.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from llmtrain_devcluster.process import free_port

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

WORLD, SLOW_RANK, SLEEP, STEPS = 3, 2, 0.06, 10


def _worker(rank: int, port: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    try:
        from torch.distributed.fsdp import fully_shard

        from llmtrain_trainer.metrics.stragglers import StragglerWindow, WaitClock, time_fsdp_collectives

        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(4)))
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        clock = WaitClock()
        assert time_fsdp_collectives(model, clock) == 5
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        window = StragglerWindow(f"node-{rank}", device=torch.device("cpu"), steps=STEPS)
        results = []
        for _ in range(2 * STEPS):
            t0 = time.perf_counter()
            if rank == SLOW_RANK:
                time.sleep(SLEEP)  # a slow GPU: this rank's own work takes longer
            loss = model(torch.randn(16, 64)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            flags = torch.zeros(3)
            with clock.timed():
                dist.all_reduce(flags)  # the step's agreement all-reduce
            top = window.add(time.perf_counter() - t0, clock.take())
            if top is not None:
                results.append([(r.rank, r.node, r.score, r.slowdown) for r in top])
        out.put((rank, results))
    finally:
        dist.destroy_process_group()


def test_the_slow_rank_is_named_with_its_node_and_its_victims_are_not():
    from llmtrain.stragglers import MIN_SLOWDOWN, RankScore, verdict

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0, p.exitcode
    got = dict(out.get() for _ in range(WORLD))
    assert got[1] == [] and got[2] == []  # only rank 0 scores
    assert len(got[0]) == 2  # one per window
    for window in got[0]:
        ranked = [RankScore(*r) for r in window]
        found = verdict(ranked, 1.2)
        assert found is not None and (found.rank, found.node) == (SLOW_RANK, f"node-{SLOW_RANK}"), ranked
        assert found.slowdown >= MIN_SLOWDOWN, ranked
        for r in ranked:
            if r.rank != SLOW_RANK:
                assert r.score < 1.2 and r.slowdown < MIN_SLOWDOWN, ranked  # the victims waited: not flagged


def test_the_slow_hook_is_off_without_its_test_module(monkeypatch):
    """Production: the variable alone does nothing (the module is in no package and no image)."""
    import sys

    from llmtrain_trainer.metrics.stragglers import TESTHOOK_ENV, test_slowness

    monkeypatch.setenv(TESTHOOK_ENV, "0:5")
    hooks = str(Path(__file__).parent / "hooks")
    assert hooks not in sys.path
    assert test_slowness(0) == 0.0
    monkeypatch.syspath_prepend(hooks)  # what a test does for its workers (PYTHONPATH)
    assert test_slowness(0) == 5.0 and test_slowness(1) == 0.0
    monkeypatch.delenv(TESTHOOK_ENV)
    assert test_slowness(0) == 0.0


def test_a_spec_cannot_reach_the_slow_hook():
    """Neither its variable nor an import path can be set through spec.cluster.env."""
    from llmtrain.validation import InvalidJob, validate
    from llmtrain_trainer.metrics.stragglers import TESTHOOK_ENV

    for name in (TESTHOOK_ENV, "PYTHONPATH"):
        spec = {
            "model": {"preset": "tiny"},
            "cluster": {"instanceType": "cpu", "nodes": 1, "env": {name: "0:5"}},
            "training": {"maxSteps": 2},
        }
        with pytest.raises(InvalidJob, match=f"spec.cluster.env.{name}"):
            validate(spec, "j", "etcd:2379")

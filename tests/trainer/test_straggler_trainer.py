"""The straggler proof on the real trainer: two torchrun "nodes" of one worker each (gloo, CPU,
FSDP2), each told its node name as the downward API tells a pod (LLMTRAIN_NODE_NAME), rank 1 slowed
by the test-only hook (tests/trainer/hooks/straggler_testhook.py: LLMTRAIN_TEST_SLOW_RANK, honoured
only with that module on the path). Rank 0's /metrics, read with the operator's own parse and
verdict, name rank 1 and its node at the end of the first window, and not the victim."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from conftest import base_spec
from llmtrain.stragglers import parse, verdict
from llmtrain_devcluster.process import free_port

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

HOOKS = str(Path(__file__).parent / "hooks")


def test_the_trainer_names_the_slow_ranks_node_within_the_window(launch):
    from llmtrain_trainer.metrics.stragglers import TESTHOOK_ENV, WINDOW_STEPS

    spec = base_spec(**{"training.maxSteps": 6 * WINDOW_STEPS, "cluster.processesPerNode": 1})
    spec["cluster"]["nodes"] = 2
    spec["training"]["globalBatchTokens"] = 32 * 2 * 2  # one micro-batch of 2 per rank
    endpoint = ("c10d", f"127.0.0.1:{free_port()}")
    workers = [
        launch(
            spec,
            1,
            rdzv=endpoint,
            nnodes=2,
            rdzv_id="stragglers",
            name=node,
            env={"LLMTRAIN_NODE_NAME": node, TESTHOOK_ENV: "1:0.1", "PYTHONPATH": HOOKS},
        )
        for node in ("node-a", "node-b")
    ]
    # The series while it runs (scraped as the operator does) ...
    # c10d's rendezvous numbers the nodes in the order they join: either launch may hold rank 0.
    # Rank 1 (slowed by the hook) runs on the other one.
    urls = [f"http://127.0.0.1:{w.metrics_port}/metrics" for w in workers]
    found, holder, deadline = None, None, time.monotonic() + 240
    while found is None and time.monotonic() < deadline and all(w.proc.poll() is None for w in workers):
        for i, url in enumerate(urls):
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    window = parse(r.read())
            except OSError:
                continue
            if window.ranks:  # only rank 0 exports the series
                holder = i
                found = verdict(window.ranks, 1.2)
                assert found is not None, window  # every window names it
                assert all(r.score < 1.2 for r in window.ranks if r.rank != 1), window  # the victim waited
                assert (found.rank, found.node) == (1, ("node-a", "node-b")[1 - i])
                break
        time.sleep(0.2)
    for w in workers:
        assert w.wait(300) == 0, w.stderr()
    assert found is not None and holder is not None, (
        f"no straggler series from rank 0 while it ran: {[w.stderr() for w in workers]}"
    )
    # ... and when: rank 0's log says at which step each window ended; the first one names rank 1.
    windows = [e for e in workers[holder].events if e.get("event") == "stragglers"]
    assert windows and windows[0]["step"] == WINDOW_STEPS, windows
    first = {r["rank"]: r for r in windows[0]["ranks"]}
    assert first[1]["node"] == ("node-a", "node-b")[1 - holder] and first[1]["score"] >= 1.2, first
    assert all(r["score"] < 1.2 for rank, r in first.items() if rank != 1), first
    for w in workers:
        assert w.wait(300) == 0, w.stderr()

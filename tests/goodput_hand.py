"""The goodput buckets by hand: from the trainer's structured step log (the `config` and `step`
events of its stdout) and the times each attempt began and ended, never from the operator's code.

One source for every proof that status.goodput matches the step log: on this machine
(tests/trainer/test_goodput_local.py: two attempts; test_inplace_restart.py: one attempt, two
worker processes) and through the operator on the chain (tests/chain/test_goodput_chain.py: both).

Per attempt, from its creation (its PyTorchJob's) to its end:

- before it: queued (the first attempt) or restarting (the previous attempt's end → this one);
- starting: creation → the first step's start (its end minus its step time);
- each worker process after the first (an in-place restart): restarting from the previous
  process's last step to this one's first step's start;
- each step: its data wait is dataWait; the rest is lostWork when an earlier process or attempt
  already reached that step, else productive;
- within a process, what is not a step (the blocking part of the saves between steps, a few
  milliseconds of bookkeeping): checkpointStall;
- after the last step: checkpointStall when the attempt succeeded (the final save, the exit,
  the control plane seeing it), restarting otherwise (the failure, its detection).

After the last attempt up to ``end``: restarting. The buckets add up to ``end - created``.
"""

from __future__ import annotations

from llmtrain import goodput as gp


def generations(events: list[dict]) -> list[list[dict]]:
    """The step events of each worker process of one launcher (pod), split at each process's
    `config` event."""
    gens: list[list[dict]] = []
    for e in events:
        if e.get("event") == "config":
            gens.append([])
        elif e.get("event") == "step":
            if not gens:
                gens.append([])
            gens[-1].append(e)
    return [g for g in gens if g]


def step_start(s: dict) -> float:
    return s["time"] - s["step_seconds"]


def hand(attempts: list[dict], created: float, end: float) -> dict[str, float]:
    """The buckets of a job created at ``created`` and ended (or looked at) at ``end``.

    ``attempts``: in order, each ``{"created", "end", "why", "gens"}``: when its PyTorchJob was
    created and when it ended (Unix seconds), why it ended (``"Succeeded"`` or anything else) and
    its step events per worker process (``generations``)."""
    b = gp.zero()
    cursor, high = created, 0
    for i, a in enumerate(attempts):
        b["queued" if i == 0 else "restarting"] += a["created"] - cursor
        gens = [g for g in a["gens"] if g]
        if not gens:  # the loop never began
            b["starting"] += a["end"] - a["created"]
            cursor = a["end"]
            continue
        b["starting"] += step_start(gens[0][0]) - a["created"]
        previous_end: float | None = None
        for steps in gens:
            start = step_start(steps[0])
            if previous_end is not None:  # in place: the dead process's last step → the new one's loop
                b["restarting"] += start - previous_end
            in_steps = 0.0
            for s in steps:
                in_steps += s["step_seconds"]
                b["dataWait"] += s["data_wait_seconds"]
                b["lostWork" if s["step"] <= high else "productive"] += s["step_seconds"] - s["data_wait_seconds"]
            b["checkpointStall"] += (steps[-1]["time"] - start) - in_steps  # the saves between steps
            high = max(high, steps[-1]["step"])
            previous_end = steps[-1]["time"]
        assert previous_end is not None
        b["checkpointStall" if a["why"] == gp.SUCCEEDED else "restarting"] += a["end"] - previous_end
        cursor = a["end"]
    b["restarting"] += end - cursor
    return b


def compare(auto: dict[str, float], hand_: dict[str, float], wall: float) -> dict[str, tuple[float, float, float]]:
    """bucket → (status.goodput, step log, their difference in % of the wall time)."""
    return {k: (round(auto[k], 3), round(hand_[k], 3), round(100 * (auto[k] - hand_[k]) / wall, 2)) for k in gp.BUCKETS}

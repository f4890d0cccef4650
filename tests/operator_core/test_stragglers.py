"""The straggler score (llmtrain/stragglers.py) against a simulated synchronous job, and the
bounded reading of rank 0's straggler series (the tenant's text).

The simulation is the physics the score is derived from, written here independently: every rank
computes, then a collective completes when the last rank has arrived, so each rank's wait is the
slowest rank's compute minus its own plus the transfer. The expected slowdown is the simulated
step with the slow rank over the simulated step with that rank at the others' median speed: two
runs of the simulation, not the module's formula."""

from __future__ import annotations

import statistics
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from llmtrain import stragglers
from llmtrain.stragglers import MIN_SLOWDOWN, RankScore, RankTiming, parse, scores, top, verdict

THRESHOLD = 1.2  # the spec's default threshold


def simulate(compute: list[float], transfer: float = 0.05, steps: int = 20) -> list[RankTiming]:
    """`steps` synchronous steps: rank i computes compute[i] s, then waits in the collective for
    the slowest rank; its window is the sums."""
    slowest = max(compute)
    return [
        RankTiming(rank=i, node=f"node-{i // 2}", compute=c * steps, wait=(slowest - c + transfer) * steps)
        for i, c in enumerate(compute)
    ]


def step_time(compute: list[float], transfer: float = 0.05) -> float:
    return max(compute) + transfer


def by_rank(ranked: list[RankScore]) -> dict[int, RankScore]:
    return {r.rank: r for r in ranked}


def test_the_slow_rank_scores_its_slowness_and_its_victims_score_one():
    compute = [1.0] * 8
    compute[5] = 1.5
    ranked = by_rank(scores(simulate(compute)))
    assert ranked[5].score == pytest.approx(1.5)
    for rank in set(ranked) - {5}:
        assert ranked[rank].score == pytest.approx(1.0)  # they waited 0.5 s a step: not their fault
        assert ranked[rank].slowdown == pytest.approx(1.0)
    # the job: 1.55 s a step with rank 5, 1.05 s without
    healed = [1.0] * 8
    assert ranked[5].slowdown == pytest.approx(step_time(compute) / step_time(healed))
    found = verdict(list(ranked.values()), THRESHOLD)
    assert found is not None and (found.rank, found.node) == (5, "node-2")


def test_two_ranks_each_against_the_other():
    ranked = by_rank(scores(simulate([2.0, 1.0])))
    assert ranked[0].score == pytest.approx(2.0)  # against the other's 1.0, not the pair's median
    assert ranked[1].score == pytest.approx(0.5)
    assert verdict(list(ranked.values()), THRESHOLD).rank == 0


def test_one_rank_has_no_reference():
    assert scores([RankTiming(0, "n", 5.0, 0.0)]) == [RankScore(0, "n", 1.0, 1.0)]
    assert scores([]) == []


def test_a_rank_nobody_waited_for_is_no_straggler():
    # rank 2 computed more, but its extra work overlapped the others' transfers: it waited as
    # long as they did, so nothing would be won by moving it
    timings = [RankTiming(i, f"n{i}", compute=10.0, wait=2.0) for i in range(4)]
    timings[2] = RankTiming(2, "n2", compute=15.0, wait=2.0)
    ranked = by_rank(scores(timings))
    assert ranked[2].score == pytest.approx(1.5)
    assert ranked[2].slowdown == pytest.approx(1.0)
    assert verdict(list(ranked.values()), THRESHOLD) is None


def test_below_the_threshold_or_the_least_slowdown_no_verdict():
    ranked = scores(simulate([1.0, 1.0, 1.0, 1.15]))
    assert verdict(ranked, THRESHOLD) is None  # 1.15 < 1.2
    assert verdict(ranked, 1.1).rank == 3
    # a slow rank in a job whose step is mostly transfer: the job loses < 2 %
    tiny = scores(simulate([0.010, 0.010, 0.010, 0.015], transfer=1.0))
    assert by_rank(tiny)[3].score == pytest.approx(1.5)
    assert by_rank(tiny)[3].slowdown < MIN_SLOWDOWN
    assert verdict(tiny, THRESHOLD) is None


def test_top_is_bounded_and_highest_first():
    compute = [1.0 + 0.01 * i for i in range(100)]
    ranked = top(scores(simulate(compute)))
    assert len(ranked) == stragglers.TOP_RANKS
    assert [r.rank for r in ranked] == list(range(99, 99 - stragglers.TOP_RANKS, -1))


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(2, 64),
    base=st.floats(0.05, 5.0),
    noise=st.lists(st.floats(-0.05, 0.05), min_size=64, max_size=64),
    slow=st.integers(0, 63),
    factor=st.floats(1.3, 4.0),
    transfer=st.floats(0.0, 0.5),
)
def test_property_the_slow_rank_is_found_and_no_victim_is(n, base, noise, slow, factor, transfer):
    slow %= n
    compute = [base * (1 + noise[i]) for i in range(n)]
    compute[slow] = base * factor
    ranked = by_rank(scores(simulate(compute, transfer)))
    found = verdict(list(ranked.values()), THRESHOLD)
    assert found is not None and found.rank == slow
    for rank, r in ranked.items():
        if rank != slow:
            assert r.score < THRESHOLD  # victims: within the noise of 1
    # its slowdown against the simulated job with that rank at the others' median
    healed = list(compute)
    healed[slow] = statistics.median(c for i, c in enumerate(compute) if i != slow)
    expected = step_time(compute, transfer) / step_time(healed, transfer)
    # the module takes the median as the healed step's pace, the simulation the slowest other
    # rank: within the noise (±5 % of the base) of each other
    assert ranked[slow].slowdown == pytest.approx(expected, rel=0.11)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 64),
    base=st.floats(0.05, 5.0),
    noise=st.lists(st.floats(-0.05, 0.05), min_size=64, max_size=64),
    transfer=st.floats(0.0, 0.5),
)
def test_property_a_healthy_job_has_no_verdict(n, base, noise, transfer):
    ranked = scores(simulate([base * (1 + noise[i]) for i in range(n)], transfer))
    assert verdict(ranked, THRESHOLD) is None
    assert all(r.score < THRESHOLD for r in ranked)


# --- reading them back: rank 0's body is the tenant's --------------------------------------------


def exposition(ranked: list[RankScore]) -> bytes:
    """What a Prometheus client writes for the series (prometheus_client, not our writer)."""
    reg = CollectorRegistry()
    score = Gauge(stragglers.SCORE, "s", ["rank", "node"], registry=reg)
    slow = Gauge(stragglers.SLOWDOWN, "s", ["rank", "node"], registry=reg)
    for r in ranked:
        score.labels(str(r.rank), r.node).set(r.score)
        slow.labels(str(r.rank), r.node).set(r.slowdown)
    return generate_latest(reg)


def test_parse_reads_what_a_prometheus_client_writes():
    compute = [1.0] * 16
    compute[9] = 1.6
    exported = top(scores(simulate(compute)))
    window = parse(exposition(exported))
    assert [r.rank for r in window.ranks] == [r.rank for r in exported]
    assert window.ranks[0] == RankScore(9, "node-4", pytest.approx(1.6), pytest.approx(exported[0].slowdown))


def line(name: str, labels: str, value: str) -> bytes:
    return f"{name}{{{labels}}} {value}\n".encode()


def both(rank: str, node: str, score: str = "1.5", slowdown: str = "1.3") -> bytes:
    labels = f'rank="{rank}",node="{node}"'
    return line(stragglers.SCORE, labels, score) + line(stragglers.SLOWDOWN, labels, slowdown)


@pytest.mark.parametrize(
    "body",
    [
        both("1", "Node-Upper"),  # not a node name
        both("1", "a" * 254),
        both("1", "node_1"),
        both("1", "-node"),
        both("x", "node-1"),  # not a rank
        both("-1", "node-1"),
        both("99999999", "node-1"),
        both("1", "node-1", score="nan"),
        both("1", "node-1", score="inf"),
        both("1", "node-1", score="-1"),
        both("1", "node-1", score="1e9"),
        both("1", "node-1", slowdown="0.5"),  # a slowdown below 1 is not one
        both("1", "node-1", slowdown="+Inf"),
        line(stragglers.SCORE, 'rank="1",node="node-1"', "1.5"),  # no slowdown
        line(stragglers.SCORE, 'rank="1",node="node-1",extra="x"', "1.5")
        + line(stragglers.SLOWDOWN, 'rank="1",node="node-1",extra="x"', "1.3"),
        line(stragglers.SCORE, 'rank="1",rank="2",node="node-1"', "1.5")
        + line(stragglers.SLOWDOWN, 'rank="1",rank="2",node="node-1"', "1.3"),
        line(stragglers.SCORE, 'rank="1",node="node-1\\",x=\\"y"', "1.5")
        + line(stragglers.SLOWDOWN, 'rank="1",node="node-1\\",x=\\"y"', "1.3"),
        # score and slowdown on two nodes: which one would it be
        line(stragglers.SCORE, 'rank="1",node="node-1"', "1.5")
        + line(stragglers.SLOWDOWN, 'rank="1",node="node-2"', "1.3"),
        b"llmtrain_trainer_straggler_scorex" + both("1", "node-1")[len(stragglers.SCORE) :],  # another name
    ],
)
def test_parse_skips_what_the_trainer_never_writes(body):
    assert parse(body).ranks == ()


def test_parse_keeps_at_most_top_ranks_and_the_first_sample():
    body = b"".join(both(str(r), f"node-{r}", score=str(1 + r / 100)) for r in range(50))
    body += both("0", "node-0", score="9.0")  # a second sample of rank 0: the first counts
    window = parse(body)
    assert len(window.ranks) <= stragglers.TOP_RANKS
    assert {r.rank for r in window.ranks} <= set(range(stragglers.TOP_RANKS))
    assert next(r for r in window.ranks if r.rank == 0).score == 1.0


def test_parse_cost_is_bounded_by_the_body_not_by_what_it_claims():
    # 64 MiB of straggler lines, and one giant line: the parse reads its bounded prefix only
    hostile = both("1", "node-1") * (64 * 1024 * 1024 // 80) + b"llmtrain_trainer_straggler_score{" + b"a" * 10**7
    start = time.process_time()
    window = parse(hostile)
    assert time.process_time() - start < 0.5
    assert [r.rank for r in window.ranks] == [1]
    assert parse(b"x" * 10**7 + both("1", "node-1")).ranks == ()  # beyond the bound: not read


def test_the_monitors_parse_carries_the_window_beside_the_progress():
    from llmtrain.controller.policy.progress import parse_progress

    compute = [1.0] * 4
    compute[2] = 1.5
    body = b"llmtrain_trainer_step 7\n" + exposition(top(scores(simulate(compute))))
    progress = parse_progress(body)
    assert progress.step == 7
    assert progress.stragglers is not None and progress.stragglers.ranks[0].rank == 2
    assert parse_progress(b"llmtrain_trainer_step 7\n").stragglers is None  # no series: no window

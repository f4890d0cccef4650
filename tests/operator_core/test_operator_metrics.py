"""The operator's per-job goodput series (controller/adapters/metrics.py): what /metrics shows, that a
deleted job's series go with it, and what a job costs the operator to add and to remove."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmtrain.controller.adapters.metrics import OperatorMetrics
from llmtrain.goodput import BADPUT


def _samples(registry, names=None) -> dict[tuple, float]:
    reg = registry.restricted_registry(names) if names else registry
    out = {}
    for family in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in family.samples:
            if s.name.startswith("llmtrain_job_"):
                out[(s.name, *sorted(s.labels.items()))] = s.value
    return out


def _summary(ratio, **seconds):
    return {"ratio": ratio, "seconds": seconds}


def test_each_job_has_its_ratio_and_one_badput_series_per_kind():
    reg = CollectorRegistry()
    m = OperatorMetrics(reg)
    m.set_goodput("a", "j1", _summary(0.75, queued=10.0, restarting=5.0))
    m.set_goodput("b", "j2", _summary(None, starting=3.0))
    got = _samples(reg)
    ratio = ("llmtrain_job_goodput_ratio", ("llmtrain_job", "j1"), ("namespace", "a"))
    assert got[ratio] == 0.75
    assert ("llmtrain_job_goodput_ratio", ("llmtrain_job", "j2"), ("namespace", "b")) not in got  # no ratio yet
    badput = {k: v for k, v in got.items() if k[0] == "llmtrain_job_badput_seconds"}
    assert len(badput) == 2 * len(BADPUT)
    assert badput[("llmtrain_job_badput_seconds", ("kind", "queued"), ("llmtrain_job", "j1"), ("namespace", "a"))] == 10
    assert badput[("llmtrain_job_badput_seconds", ("kind", "hang"), ("llmtrain_job", "j1"), ("namespace", "a"))] == 0
    # a later summary without a ratio keeps the last one; the seconds are replaced
    m.set_goodput("a", "j1", _summary(None, queued=12.0))
    got = _samples(reg)
    assert got[ratio] == 0.75
    assert got[("llmtrain_job_badput_seconds", ("kind", "restarting"), ("llmtrain_job", "j1"), ("namespace", "a"))] == 0
    # the families are known to the registry by name (a scrape may ask for one: name[]=...)
    only = _samples(reg, ["llmtrain_job_goodput_ratio"])
    assert set(only) == {ratio}


def test_a_deleted_jobs_series_go_and_only_its():
    reg = CollectorRegistry()
    m = OperatorMetrics(reg)
    for name in ("j1", "j2"):
        m.set_goodput("ns", name, _summary(0.5, queued=1.0))
    m.restarts.labels("ns", "j1", "Hang").inc()
    m.forget_job("ns", "j1")
    jobs = {dict(k[1:]).get("llmtrain_job") for k in _samples(reg)}
    assert jobs == {"j2"}
    assert 'llmtrain_job="j1"' not in generate_latest(reg).decode()


def test_adding_and_removing_a_thousand_jobs_costs_milliseconds_not_seconds():
    """With two Gauges (8 children per job) adding 1,000 jobs cost 0.17 s of CPU and removing
    them 27 s: each removal scanned every job's series. Bounds with a wide margin (measured now:
    ~7 ms and ~10 ms on 2 cores)."""
    m = OperatorMetrics(CollectorRegistry())
    names = [f"job-{i:04d}" for i in range(1000)]
    started = time.process_time()
    for n in names:
        m.set_goodput("ns", n, _summary(0.5, queued=1.0))
    added = time.process_time() - started
    started = time.process_time()
    for n in names:
        m.forget_job("ns", n)
    removed = time.process_time() - started
    assert added < 0.1 and removed < 1.0, (added, removed)


def test_a_jobs_recorded_straggler_is_three_series_while_it_lasts():
    reg = CollectorRegistry()
    m = OperatorMetrics(reg)
    straggler = {"attempt": 1, "rank": 5, "node": "n7", "score": 1.5, "slowdown": 1.31, "since": "2026-03-01T12:00:00Z"}
    m.stragglers.set("a", "j1", straggler, 600.0)
    got = {k: v for k, v in _samples(reg).items() if "straggler" in k[0]}
    labels = (("llmtrain_job", "j1"), ("namespace", "a"), ("node", "n7"), ("rank", "5"))
    assert got == {
        ("llmtrain_job_straggler_slowdown", *labels): 1.31,
        ("llmtrain_job_straggler_since_timestamp_seconds", *labels): 1772366400.0,  # 2026-03-01T12:00:00Z
        ("llmtrain_job_straggler_act_after_seconds", ("llmtrain_job", "j1"), ("namespace", "a")): 600.0,
    }
    m.stragglers.set("a", "j1", None, 600.0)  # replaced, or no straggler any more: gone
    assert not [k for k in _samples(reg) if "straggler" in k[0]]
    m.stragglers.set("a", "j1", straggler, 600.0)
    m.forget_job("a", "j1")
    assert 'llmtrain_job="j1"' not in generate_latest(reg).decode()

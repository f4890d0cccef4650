"""Deleted jobs' node faults and node-hours stay evidence for the node MTBF (controller/adapters/retired.py):
the ledger's arithmetic by hand, its bounds, and its conditional writes against a fake API boundary
(the real API server: test_retired_cluster.py)."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from llmtrain.controller.adapters import reliability, retired

from .decide_world import NOW
from .test_checkpoint_cadence import P5_NODE_MTBF_H, H, _bad, _job

P5 = "p5.48xlarge"
T = NOW.timestamp()


def _uid(job: dict, uid: str) -> dict:
    job["metadata"]["uid"] = uid
    return job


def test_deleted_jobs_add_up_per_instance_type_and_namespace():
    ledger = retired.parse(None)
    a1 = _uid(_job("team-a", P5, 16, 10 * H, [_bad(1, "XID 79", 79), _bad(2, "EFA error"), _bad(3, "exit 1")]), "u1")
    a2 = _uid(_job("team-a", P5, 2, 5 * H, [_bad(1, "DeletionByPodGC")]), "u2")
    b = _uid(_job("team-b", P5, 4, 1 * H), "u3")
    other = _uid(_job("team-a", "p4d.24xlarge", 1, 3 * H, [_bad(1, "XID 48", 48)]), "u4")
    for job in (a1, a2, b, other):
        ledger = retired.fold(ledger, job, T)
    assert retired.totals(ledger, P5) == {"team-a": (2 + 1, 16 * 10 + 2 * 5), "team-b": (0, 4)}
    assert retired.totals(ledger, "p4d.24xlarge") == {"team-a": (1, 3)}
    assert ledger["uids"] == ["u1", "u2", "u3", "u4"]
    # counted once: the same uid again (a write whose answer was lost) adds nothing
    assert retired.fold(ledger, a1, T) is None
    # nothing to add: no uid, no instance type, nothing run and no fault
    assert retired.fold(ledger, {"metadata": {"namespace": "x"}}, T) is None
    assert retired.fold(ledger, _uid(_job("team-a", P5, 1, 0), "u5"), T) is None
    # what it writes it reads back
    assert retired.parse(json.dumps(ledger)) == ledger


def test_the_estimate_counts_live_and_deleted_jobs_under_one_namespace_cap():
    live = [_job("team-a", P5, 16, 40 * H, [_bad(1, "XID 79", 79)])]
    deleted = {"team-a": (2, 1400.0), "team-c": (20, 2.0)}  # team-c: 20 faked XIDs in 2 node-hours
    node = reliability.estimate(live, P5, T, deleted)
    # team-a: 1 + 2 failures in 2,040 node-hours (its cap: ⌈10 × 2040 / 6334.6⌉ = 4); team-c: at
    # most its ceiling, the prior's weight (2)
    assert node.failures == 3 + 2
    assert node.node_hours == pytest.approx(640 + 1400 + 2)
    assert node.hours == pytest.approx((2 * P5_NODE_MTBF_H + 2042) / (2 + 5))
    # without the deleted jobs: team-a's 1 failure in 640 node-hours
    assert reliability.estimate(live, P5, T).failures == 1
    # a namespace's live and deleted failures share its cap: 2 deleted + 2 live claims in 1 node-hour
    capped = reliability.estimate(
        [_job("team-d", P5, 1, 0.5 * H, [_bad(n, "XID 79", 79) for n in (1, 2)])], P5, T, {"team-d": (2, 0.5)}
    )
    assert capped.failures == 2


def test_the_ledger_is_bounded():
    full = {"instances": {P5: {f"ns-{i}": [0, 1.0] for i in range(retired.MAX_NAMESPACES)}}, "uids": []}
    ledger = retired.fold(retired.parse(json.dumps(full)), _uid(_job("late", P5, 1, H, [_bad(1, "EFA error")]), "u"), T)
    assert ledger is not None and "late" not in ledger["instances"][P5]
    assert ledger["instances"][P5][retired.SHARED] == [1, pytest.approx(1.0)]
    uids = {"instances": {}, "uids": [f"u{i}" for i in range(retired.MAX_UIDS)]}
    ledger = retired.fold(retired.parse(json.dumps(uids)), _uid(_job("a", P5, 1, H), "new"), T)
    assert ledger is not None and len(ledger["uids"]) == retired.MAX_UIDS and ledger["uids"][-1] == "new"
    # whatever the ConfigMap holds: an empty ledger, never an exception
    for junk in ("{", "[]", '{"instances": {"p5.48xlarge": {"a": [1]}}, "uids": [3]}', "x" * (retired.MAX_BYTES + 1)):
        parsed = retired.parse(junk)
        assert parsed["uids"] == [] and retired.totals(parsed, P5) == {}


class FakeConfigMaps:
    """The API boundary (kube.get/create/replace_configmap), with a writer that gets in between."""

    def __init__(self):
        self.cm: dict | None = None
        self.rv = 0
        self.interloper: dict | None = None  # written by "someone else" right after our next read
        self.reads = 0

    def get_configmap(self, namespace, name):
        self.reads += 1
        out = json.loads(json.dumps(self.cm)) if self.cm else None
        if self.interloper is not None:
            self._store(self.interloper)
            self.interloper = None
        return out

    def _store(self, data):
        self.rv += 1
        self.cm = {"metadata": {"resourceVersion": str(self.rv)}, "data": data}

    def create_configmap(self, namespace, name, data):
        if self.cm is not None:
            raise ApiException(status=409)
        self._store(data)

    def replace_configmap(self, namespace, name, data, resource_version):
        if self.cm is None or resource_version != self.cm["metadata"]["resourceVersion"]:
            raise ApiException(status=409)
        self._store(data)


def test_writes_are_conditional_and_add_to_the_fresh_state():
    api = FakeConfigMaps()
    ledger = retired.RetiredJobs("llmtrain-system", "llmtrain-reliability", api, clock=lambda: T)
    assert ledger.of(P5) == {}
    assert ledger.retire(_uid(_job("a", P5, 1, H, [_bad(1, "EFA error")]), "u1"))
    # another replica's write lands between our read and our write: 409, read again, add again
    theirs = retired.fold(retired.parse(api.cm["data"][retired.KEY]), _uid(_job("b", P5, 2, H), "u2"), T)
    api.interloper = {retired.KEY: json.dumps(theirs)}
    assert ledger.retire(_uid(_job("a", P5, 1, H, [_bad(1, "XID 79", 79)]), "u3"))
    assert ledger.of(P5) == {"a": (2, 2.0), "b": (0, 2.0)}
    assert not ledger.retire(_uid(_job("a", P5, 1, H, [_bad(1, "XID 79", 79)]), "u3"))  # counted already
    # a job with nothing to add (never ran, no fault) costs no request
    reads = api.reads
    assert not ledger.retire(_uid(_job("a", P5, 1, 0), "u4")) and api.reads == reads
    # a restarted operator reads the same totals
    again = retired.RetiredJobs("llmtrain-system", "llmtrain-reliability", api, clock=lambda: T)
    assert again.of(P5) == {"a": (2, 2.0), "b": (0, 2.0)}

"""The operator's spec cache: one validation per job generation, the admission policy read once,
and a deleted job's entry dropped without walking the others."""

from __future__ import annotations

import time

from llmtrain.controller.adapters.caches import SpecCache
from llmtrain.validation import Policy

from .decide_world import ETCD, tiny


def test_one_validation_per_generation_and_a_new_generation_is_validated_again():
    cache = SpecCache(ETCD, Policy())
    first, err = cache.resolve("uid-1", 1, "j", tiny())
    assert err is None and first is not None
    assert cache.resolve("uid-1", 1, "j", tiny())[0] is first  # the same object: not validated again
    bad, err = cache.resolve("uid-1", 2, "j", tiny(training={"maxSteps": -1}))
    assert bad is None and "spec.training.maxSteps" in err


def test_the_admission_policy_is_the_one_given_at_start_not_the_environment_of_each_call(monkeypatch):
    cache = SpecCache(ETCD, Policy(image_registries=("registry.example",)))
    monkeypatch.delenv(Policy.ENV_IMAGES, raising=False)
    spec, err = cache.resolve("uid-1", 1, "j", tiny())
    assert spec is None and "spec.cluster.image" in err and "registry.example" in err


def test_forgetting_a_job_drops_its_entry_only_and_costs_no_walk_over_the_others():
    cache = SpecCache(ETCD, Policy())
    for i in range(20000):  # a full cache: the 20,000 most recently resolved jobs
        cache._specs[f"uid-{i}"] = ((1, f"j{i}"), (None, "x"))
    started = time.perf_counter()
    for i in range(2000):
        cache.forget(f"uid-{i}")
    # a walk over 20,000 entries per deleted job is ~2 s here; one dict pop each is ~1 ms
    assert time.perf_counter() - started < 0.2
    assert "uid-0" not in cache._specs and "uid-1999" not in cache._specs and "uid-2000" in cache._specs
    assert len(cache._specs) == 18000

"""Offline validation: every problem names the field, the reason and what would be accepted."""

import subprocess
import sys

import pytest
import yaml

from llmtrain.validation import InvalidJob, check, parse_spec, validate

from .invalid_cases import BASE, CASES, spec_with


def test_base_spec_is_valid():
    assert check(parse_spec(BASE), "job") == []


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_invalid_spec_names_field_reason_and_alternative(case):
    _, name, overrides, field, fragment = case
    with pytest.raises(InvalidJob) as err:
        validate(spec_with(overrides), name)
    hits = [p for p in err.value.problems if p.field == field]
    assert hits, f"no problem on {field}: {err.value}"
    assert fragment in hits[0].reason and hits[0].accepted
    assert {p.field for p in err.value.problems} == {field}  # and it fails for that reason alone


@pytest.mark.parametrize("overrides,field,fragment", [
    ({"cluster": {"instanceType": "p9.48xlarge"}}, "spec.cluster.instanceType", "unknown instance type"),
    ({"model": {"preset": "llama9"}}, "spec.model.preset", "unknown preset"),
    ({"cluster": {"nodes": 0}}, "spec.cluster.nodes", "out of range"),
    ({"fsdp": {"shardingStrategy": "ZERO3"}}, "spec.fsdp.shardingStrategy", "not a known value"),
    ({"model": {"preset": "llama2-7b", "hfToken": "hf_abc"}}, "spec.model.hfToken", "plain text"),
    ({"training": {"learningRate": -1}}, "spec.training.learningRate", "out of range"),
    ({"fsdp": {"sharding": "FULL_SHARD"}}, "spec.fsdp.sharding", "unknown field"),
    ({"cluster": {"queueName": "Bad Queue!"}}, "spec.cluster.queueName", "pattern"),
    ({"rendezvous": {"endpoint": "etcd:notaport"}}, "spec.rendezvous.endpoint", "pattern"),
    ({"rendezvous": {"endpoint": "etcd:99999"}}, "spec.rendezvous.endpoint", "no valid port"),
    ({"cluster": {"image": "Bad Image!!"}}, "spec.cluster.image", "pattern"),
    ({"cluster": {"serviceAccountName": "Bad_SA"}}, "spec.cluster.serviceAccountName", "pattern"),
    ({"cluster": {"nodeSelector": {"bad key!": "x"}}}, "spec.cluster.nodeSelector.bad key!", "not a valid label key"),
    ({"cluster": {"nodeSelector": {"node.kubernetes.io/instance-type": "p4d.24xlarge"}}},
     "spec.cluster.nodeSelector.node.kubernetes.io/instance-type", "set from spec.cluster.instanceType"),
])
def test_schema_level_problems_are_explained_offline(overrides, field, fragment):
    with pytest.raises(InvalidJob) as err:
        validate(spec_with(overrides), "job")
    assert any(p.field == field and fragment in p.reason for p in err.value.problems), str(err.value)


def test_inline_token_is_never_echoed():
    with pytest.raises(InvalidJob) as err:
        validate(spec_with({"model": {"preset": "llama2-7b", "hfToken": "hf_secret123"}}), "job")
    assert "hf_secret123" not in str(err.value)


def test_all_problems_reported_at_once():
    with pytest.raises(InvalidJob) as err:
        validate(spec_with({"data": {"uri": "gs://x"}, "checkpoint": {"uri": "ftp://y"},
                            "training": {"warmupSteps": 500}}), "job")
    assert {"spec.data.uri", "spec.checkpoint.uri", "spec.training.warmupSteps"} <= {p.field for p in err.value.problems}


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "llmtrain.cli", *args], capture_output=True, text=True)


def test_cli_validate_exit_codes(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"apiVersion": "llmtrain.dev/v1alpha1", "kind": "LLMTrainingJob",
                                    "metadata": {"name": "ok"}, "spec": BASE}))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"apiVersion": "llmtrain.dev/v1alpha1", "kind": "LLMTrainingJob",
                                   "metadata": {"name": "bad"},
                                   "spec": spec_with({"fsdp": {"shardingStrategy": "HYBRID_SHARD"},
                                                      "cluster": {"nodes": 1},
                                                      "training": {"globalBatchTokens": 4096 * 8 * 4}})}))
    assert _cli("validate", str(good)).returncode == 0
    r = _cli("validate", str(bad))
    assert r.returncode == 1 and "spec.fsdp.shardingStrategy" in r.stderr and "FULL_SHARD" in r.stderr
    r = _cli("render", str(good))
    assert r.returncode == 0 and yaml.safe_load(r.stdout)["kind"] == "PyTorchJob"
    wrong_kind = tmp_path / "pod.yaml"
    wrong_kind.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n")
    assert "exactly one" in _cli("validate", str(wrong_kind)).stderr

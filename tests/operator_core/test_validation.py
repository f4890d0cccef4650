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


@pytest.mark.parametrize(
    "overrides,field,fragment",
    [
        ({"cluster": {"instanceType": "p9.48xlarge"}}, "spec.cluster.instanceType", "unknown instance type"),
        ({"model": {"preset": "llama9"}}, "spec.model.preset", "unknown preset"),
        ({"cluster": {"nodes": 0}}, "spec.cluster.nodes", "out of range"),
        ({"fsdp": {"shardingStrategy": "ZERO3"}}, "spec.fsdp.shardingStrategy", "not a known value"),
        ({"model": {"preset": "llama2-7b", "hfToken": "hf_abc"}}, "spec.model.hfToken", "plain text"),
        ({"training": {"learningRate": -1}}, "spec.training.learningRate", "out of range"),
        ({"resilience": {"inPlaceRestarts": 11}}, "spec.resilience.inPlaceRestarts", "out of range"),
        ({"resilience": {"inPlaceRestarts": -1}}, "spec.resilience.inPlaceRestarts", "out of range"),
        ({"resilience": {"inPlaceRestarts": "many"}}, "spec.resilience.inPlaceRestarts", "integer"),
        ({"fsdp": {"sharding": "FULL_SHARD"}}, "spec.fsdp.sharding", "unknown field"),
        ({"cluster": {"queueName": "Bad Queue!"}}, "spec.cluster.queueName", "not a Kueue LocalQueue name"),
        (
            {"cluster": {"queueName": "q", "topology": {"mode": "required", "level": "rack"}}},
            "spec.cluster.topology.level",
            "not a topology level",
        ),
        (
            {"cluster": {"queueName": "q", "topology": {"mode": "always", "level": "kubernetes.io/hostname"}}},
            "spec.cluster.topology.mode",
            "not a known value",
        ),
        ({"rendezvous": {"endpoint": "etcd:notaport"}}, "spec.rendezvous.endpoint", "not host:port"),
        ({"rendezvous": {"endpoint": "etcd:99999"}}, "spec.rendezvous.endpoint", "no valid port"),
        ({"cluster": {"image": "Bad Image!!"}}, "spec.cluster.image", "not a container image reference"),
        ({"cluster": {"serviceAccountName": "Bad_SA"}}, "spec.cluster.serviceAccountName", "not a DNS subdomain"),
        (
            {"cluster": {"nodeSelector": {"bad key!": "x"}}},
            "spec.cluster.nodeSelector.bad key!",
            "not a valid label key",
        ),
        (
            {"cluster": {"nodeSelector": {"node.kubernetes.io/instance-type": "p4d.24xlarge"}}},
            "spec.cluster.nodeSelector.node.kubernetes.io/instance-type",
            "set from spec.cluster.instanceType",
        ),
    ],
)
def test_schema_level_problems_are_explained_offline(overrides, field, fragment):
    with pytest.raises(InvalidJob) as err:
        validate(spec_with(overrides), "job")
    assert any(p.field == field and fragment in p.reason for p in err.value.problems), str(err.value)


@pytest.mark.parametrize(
    "overrides,field,words",
    [
        (
            {"cluster": {"serviceAccountName": "Bad_SA"}},
            "spec.cluster.serviceAccountName",
            ("'Bad_SA' is not a DNS subdomain", "lowercase letters, digits, '-' and '.'"),
        ),
        (
            {"cluster": {"priorityClassName": "High.Priority"}},
            "spec.cluster.priorityClassName",
            ("is not a DNS subdomain",),
        ),
        (
            {"cluster": {"volumes": [{"name": "Scratch", "claimName": "c", "mountPath": "/s"}]}},
            "spec.cluster.volumes[0].name",
            ("'Scratch' is not a DNS label", "up to 63 lowercase"),
        ),
        (
            {"cluster": {"volumes": [{"name": "s", "claimName": "c", "mountPath": "rel/path"}]}},
            "spec.cluster.volumes[0].mountPath",
            ("is not an absolute path", "starting with '/'"),
        ),
        ({"cluster": {"nodeSelector": {"pool": "a b"}}}, "spec.cluster.nodeSelector.pool", ("is not a label value",)),
        ({"cluster": {"queueName": "Bad Queue!"}}, "spec.cluster.queueName", ("not a Kueue LocalQueue name", "team-a")),
        (
            {"cluster": {"queueName": "q", "workloadPriorityClass": "Prod_High"}},
            "spec.cluster.workloadPriorityClass",
            ("'Prod_High' is not a Kueue WorkloadPriorityClass name", "e.g. 'production'"),
        ),
        ({"rendezvous": {"endpoint": "http://etcd:2379"}}, "spec.rendezvous.endpoint", ("not host:port", "no scheme")),
        ({"cluster": {"image": "Bad Image!!"}}, "spec.cluster.image", ("not a container image reference", "[:tag]")),
    ],
)
def test_name_format_problems_are_said_in_words(overrides, field, words):
    """A Kubernetes-name mismatch says which field, what it must be and an example, never pydantic's
    "String should match pattern '^…$'" (what `llmtrain validate` and the operator's Failed message
    showed before)."""
    with pytest.raises(InvalidJob) as err:
        validate(spec_with(overrides), "job")
    assert "should match pattern" not in str(err.value) and "^" not in str(err.value), str(err.value)
    (problem,) = [p for p in err.value.problems if p.field == field]
    text = f"{problem.reason} (accepted: {problem.accepted})"
    for w in words:
        assert w in text, text


def test_inline_token_is_never_echoed():
    with pytest.raises(InvalidJob) as err:
        validate(spec_with({"model": {"preset": "llama2-7b", "hfToken": "hf_secret123"}}), "job")
    assert "hf_secret123" not in str(err.value)


def test_all_problems_reported_at_once():
    with pytest.raises(InvalidJob) as err:
        validate(
            spec_with({"data": {"uri": "gs://x"}, "checkpoint": {"uri": "ftp://y"}, "training": {"warmupSteps": 500}}),
            "job",
        )
    assert {"spec.data.uri", "spec.checkpoint.uri", "spec.training.warmupSteps"} <= {
        p.field for p in err.value.problems
    }


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "llmtrain.cli", *args], capture_output=True, text=True)


def test_cli_validate_exit_codes(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(
        yaml.safe_dump(
            {"apiVersion": "llmtrain.dev/v1alpha1", "kind": "LLMTrainingJob", "metadata": {"name": "ok"}, "spec": BASE}
        )
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "llmtrain.dev/v1alpha1",
                "kind": "LLMTrainingJob",
                "metadata": {"name": "bad"},
                "spec": spec_with(
                    {
                        "fsdp": {"shardingStrategy": "HYBRID_SHARD"},
                        "cluster": {"nodes": 1},
                        "training": {"globalBatchTokens": 4096 * 8 * 4},
                    }
                ),
            }
        )
    )
    assert _cli("validate", str(good)).returncode == 0
    r = _cli("validate", str(bad))
    assert r.returncode == 1 and "spec.fsdp.shardingStrategy" in r.stderr and "FULL_SHARD" in r.stderr
    r = _cli("render", str(good))
    assert r.returncode == 0 and yaml.safe_load(r.stdout)["kind"] == "PyTorchJob"
    wrong_kind = tmp_path / "pod.yaml"
    wrong_kind.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n")
    assert "exactly one" in _cli("validate", str(wrong_kind)).stderr


# --- Defaults derived from the rest of the spec (issue 10, defect 3) -----------------------------
MINIMAL_CPU = {"model": {"preset": "tiny"}, "cluster": {"instanceType": "cpu"}}


def test_short_run_without_warmup_is_valid_and_warms_up_for_a_tenth():
    spec = validate({**MINIMAL_CPU, "training": {"maxSteps": 12}}, "job")
    assert spec.training.warmup_steps == 1  # 10% of 12, below maxSteps
    assert validate({**MINIMAL_CPU, "training": {"maxSteps": 5000}}, "job").training.warmup_steps == 100


def test_tiny_on_cpu_defaults_to_one_micro_step_of_its_own_context():
    spec = validate(MINIMAL_CPU, "job")
    # tiny's context is 256 tokens (data/models.yaml), the cpu type runs 2 workers (data/instances.yaml):
    # one sequence per worker per step, so a step is a fraction of a second, not minutes.
    assert spec.data.seq_len == 256
    assert spec.training.global_batch_tokens == 256 * 1 * 2


def test_gpu_default_batch_fits_any_worker_count():
    # 3 × p5 = 24 GPUs at seqLen 4096: one micro-step is 98,304 tokens, which 4 Mi does not divide;
    # the default is the nearest multiple of it (43 micro-steps), so the spec stays valid.
    spec = validate(
        {
            "model": {"preset": "llama2-7b"},
            "data": {"seqLen": 4096},
            "cluster": {"instanceType": "p5.48xlarge", "nodes": 3},
        },
        "job",
    )
    assert spec.training.global_batch_tokens == 43 * 4096 * 24
    # A small custom model takes the small-model batch (0.5 Mi tokens: GPT-3's for < 1 B params).
    small = validate(
        {
            "model": {
                "dims": {
                    "hiddenSize": 512,
                    "intermediateSize": 1408,
                    "numLayers": 8,
                    "numHeads": 8,
                    "numKvHeads": 8,
                    "vocabSize": 32000,
                }
            },
            "data": {"seqLen": 1024},
            "cluster": {"instanceType": "p5.48xlarge"},
        },
        "job",
    )
    assert small.training.global_batch_tokens == 512 * 1024


def test_explicit_values_are_kept_and_still_checked():
    spec = validate(
        {
            **MINIMAL_CPU,
            "data": {"seqLen": 128},
            "training": {"maxSteps": 40, "warmupSteps": 7, "globalBatchTokens": 2048},
        },
        "job",
    )
    assert (spec.data.seq_len, spec.training.warmup_steps, spec.training.global_batch_tokens) == (128, 7, 2048)
    with pytest.raises(InvalidJob, match="warmupSteps"):
        validate({**MINIMAL_CPU, "training": {"maxSteps": 12, "warmupSteps": 12}}, "job")


def test_validate_and_plan_show_the_resolved_values(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "llmtrain.dev/v1alpha1",
                "kind": "LLMTrainingJob",
                "metadata": {"name": "short"},
                "spec": {**MINIMAL_CPU, "training": {"maxSteps": 12}},
            }
        )
    )
    out = subprocess.run([sys.executable, "-m", "llmtrain.cli", "validate", str(job)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines()[2:]}
    assert "1" in lines["training.warmupSteps"].split() and "derived:" in lines["training.warmupSteps"]
    assert "512" in lines["training.globalBatchTokens"].split()
    assert "derived" not in lines["training.maxSteps"]
    plan = subprocess.run(
        [sys.executable, "-m", "llmtrain.cli", "plan", str(job), "--output", "json"], capture_output=True, text=True
    )
    resolved = __import__("json").loads(plan.stdout)["resolved"]
    assert (
        resolved["training.globalBatchTokens"]["value"] == 512 and "derived" in resolved["training.globalBatchTokens"]
    )
    assert resolved["training.maxSteps"] == {"value": 12}
    assert resolved["resilience.preflight"]["value"] is False and "derived" in resolved["resilience.preflight"]


# --- Allow-lists (issue 10, defect 8) ----------------------------------------------------------
def test_allow_lists_reject_other_registries_and_service_accounts():
    from llmtrain.validation import Policy

    policy = Policy(("public.ecr.aws/llmtrain", "111122223333.dkr.ecr.us-east-1.amazonaws.com/"), ("llmtrain-trainer",))
    ok = {
        **MINIMAL_CPU,
        "cluster": {
            "instanceType": "cpu",
            "image": "public.ecr.aws/llmtrain/llmtrain-trainer:0.1.0",
            "serviceAccountName": "llmtrain-trainer",
        },
    }
    validate(ok, "job", policy=policy)
    validate(
        {
            **MINIMAL_CPU,
            "cluster": {
                "instanceType": "cpu",
                "image": "111122223333.dkr.ecr.us-east-1.amazonaws.com/team/trainer@sha256:" + "a" * 64,
            },
        },
        "job",
        policy=policy,
    )  # no serviceAccountName: the namespace default, always allowed
    for image in (
        "docker.io/someone/miner:latest",
        "public.ecr.aws/llmtrain-evil/trainer:1",
        "public.ecr.aws/llmtrainer",
    ):
        with pytest.raises(InvalidJob) as err:
            validate({**MINIMAL_CPU, "cluster": {"instanceType": "cpu", "image": image}}, "job", policy=policy)
        (p,) = err.value.problems
        assert p.field == "spec.cluster.image" and "public.ecr.aws/llmtrain" in p.accepted
    with pytest.raises(InvalidJob) as err:
        validate(
            {**MINIMAL_CPU, "cluster": {"instanceType": "cpu", "serviceAccountName": "admin"}}, "job", policy=policy
        )
    assert [p.field for p in err.value.problems] == ["spec.cluster.serviceAccountName"]


def test_allow_lists_come_from_the_operator_environment(monkeypatch):
    from llmtrain.validation import Policy

    assert Policy.from_env({}) == Policy()  # nothing set: no restriction
    monkeypatch.setenv(Policy.ENV_IMAGES, "public.ecr.aws/llmtrain, 1.dkr.ecr.us-east-1.amazonaws.com")
    monkeypatch.setenv(Policy.ENV_SERVICE_ACCOUNTS, "llmtrain-trainer")
    with pytest.raises(InvalidJob, match=r"spec.cluster.image"):  # validate() reads the environment
        validate({**MINIMAL_CPU, "cluster": {"instanceType": "cpu", "image": "quay.io/x/y:1"}}, "job")
    validate(MINIMAL_CPU, "job")

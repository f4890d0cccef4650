"""Against Hugging Face `transformers`: the pretrained loader (config.json checked, Llama 3.1 RoPE
scaling) gives the same logits as `LlamaForCausalLM`, and `llmtrain export` writes a model that
`transformers` loads with the same logits."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from llmtrain.catalog import ModelDims, RopeScaling

pytestmark = pytest.mark.trainer

TINY = ModelDims(
    hidden_size=64,
    intermediate_size=176,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    vocab_size=256,
    max_seq_len=128,
    rope_theta=500000.0,
    norm_eps=1e-5,
)
# original context 32 and head_dim 16: the three frequency bands of the llama3 rule are all populated.
LLAMA31 = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=32)


def hf_model(dims: ModelDims, path, tie: bool = False):
    """A randomly initialised transformers LlamaForCausalLM (norm gains perturbed too), saved as a
    Hugging Face checkpoint (model.safetensors + config.json) in `path`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_type": "default", "rope_theta": dims.rope_theta}
    if dims.rope_scaling is not None:
        rope = {
            "rope_type": "llama3",
            "rope_theta": dims.rope_theta,
            **{
                k: getattr(dims.rope_scaling, k)
                for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            },
        }
    cfg = LlamaConfig(
        vocab_size=dims.vocab_size,
        hidden_size=dims.hidden_size,
        intermediate_size=dims.intermediate_size,
        num_hidden_layers=dims.num_layers,
        num_attention_heads=dims.num_heads,
        num_key_value_heads=dims.num_kv_heads,
        max_position_embeddings=dims.max_seq_len,
        rms_norm_eps=dims.norm_eps,
        rope_parameters=rope,
        tie_word_embeddings=tie,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    model.save_pretrained(str(path))
    return model


def ours(dims: ModelDims, path):
    from llmtrain_trainer.models.llama import Llama
    from llmtrain_trainer.models.pretrained import load_pretrained

    model = Llama(dims)
    model.init_rope("cpu")
    load_pretrained(model, str(path))
    return model.eval()


@pytest.mark.parametrize(
    "scaling,tie",
    [(None, False), (LLAMA31, False), (LLAMA31, True)],
    ids=["llama3", "llama3.1-rope-scaling", "llama3.2-tied"],
)
def test_pretrained_logits_match_transformers(tmp_path, scaling, tie):
    dims = dataclasses.replace(TINY, rope_scaling=scaling)
    theirs = hf_model(dims, tmp_path, tie=tie)
    mine = ours(dims, tmp_path)
    tokens = torch.randint(0, dims.vocab_size, (2, dims.max_seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs(tokens).logits
        got = mine(tokens)
    assert (got - expected).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    "change,field",
    [
        ({"rope_scaling": None}, "rope_scaling"),  # Llama 3.1 weights as plain Llama 3
        ({"rope_theta": 10000.0}, "rope_theta"),
        ({"norm_eps": 1e-6}, "rms_norm_eps"),
        ({"rope_scaling": dataclasses.replace(LLAMA31, factor=4.0)}, "rope_scaling"),
    ],
)
def test_pretrained_config_mismatch_is_refused(tmp_path, change, field):
    """Defect: config.json was never read, so these loaded silently with wrong logits."""
    hf_model(dataclasses.replace(TINY, rope_scaling=LLAMA31), tmp_path)
    with pytest.raises(ValueError, match="config.json does not match spec.model") as err:
        ours(dataclasses.replace(TINY, **{"rope_scaling": LLAMA31, **change}), tmp_path)
    assert field + ":" in str(err.value)


def test_llama31_presets_carry_the_released_rope_scaling():
    from llmtrain.catalog import model_preset
    from llmtrain.defaults import resolve
    from llmtrain.spec import LLMTrainingJobSpec, resolve_dims

    for name in ("llama3.1-8b", "llama3.1-70b"):
        d = model_preset(name)
        assert d.rope_scaling == RopeScaling(
            factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
        )
        assert d.rope_theta == 500000.0 and d.max_seq_len == 131072
    spec = resolve(
        LLMTrainingJobSpec.model_validate(
            {
                "model": {
                    "dims": {
                        "hiddenSize": 64,
                        "intermediateSize": 176,
                        "numLayers": 2,
                        "numHeads": 4,
                        "numKvHeads": 2,
                        "vocabSize": 256,
                        "ropeScaling": {
                            "ropeType": "llama3",
                            "factor": 8,
                            "lowFreqFactor": 1,
                            "highFreqFactor": 4,
                            "originalMaxPositionEmbeddings": 32,
                        },
                    }
                },
                "cluster": {"instanceType": "cpu"},
            }
        )
    )
    assert resolve_dims(spec.model).rope_scaling == LLAMA31


def _prepared_with_tokenizer(tmp_path) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from llmtrain_trainer.data.prepare import prepare

    src = tmp_path / "text"
    src.mkdir()
    (src / "a.txt").write_text("the quick brown fox jumps over the lazy dog " * 20)
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train([str(src / "a.txt")], trainers.WordLevelTrainer(special_tokens=["<unk>", "</s>"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    prepare([str(src)], str(tmp_path / "tokens"), tokenizer=str(tmp_path / "tokenizer.json"))
    return str(tmp_path / "tokens")


@pytest.mark.parametrize("max_shard_gb", [5.0, 0.0001], ids=["one-file", "sharded"])
def test_export_checkpoint_loads_in_transformers_with_the_same_logits(tmp_path, capsys, max_shard_gb):
    """A checkpoint in the trainer's format (DCP, LocalStore layout) → `llmtrain export` → the
    directory loads with AutoModelForCausalLM and gives the trainer model's logits."""
    import json

    import torch.distributed.checkpoint as dcp
    import yaml
    from trainer_reference import reference_model
    from transformers import AutoModelForCausalLM

    from llmtrain.cli import main
    from llmtrain.defaults import resolve
    from llmtrain.spec import LLMTrainingJobSpec

    data = _prepared_with_tokenizer(tmp_path)  # token shards with the tokenizer.json beside them
    spec = {
        "model": {
            "dims": {
                "hiddenSize": 64,
                "intermediateSize": 176,
                "numLayers": 2,
                "numHeads": 4,
                "numKvHeads": 2,
                "vocabSize": 256,
                "maxSeqLen": 128,
                "ropeTheta": 500000.0,
                "ropeScaling": {
                    "ropeType": "llama3",
                    "factor": 8,
                    "lowFreqFactor": 1,
                    "highFreqFactor": 4,
                    "originalMaxPositionEmbeddings": 32,
                },
            }
        },
        "data": {"uri": f"file://{data}", "seqLen": 32},
        "cluster": {"instanceType": "cpu"},
        "checkpoint": {"uri": f"file://{tmp_path}/ckpt"},
    }
    model = reference_model(resolve(LLMTrainingJobSpec.model_validate(spec)), seed=7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    sd = {"model": model.state_dict(), "train": {"step": 3}}
    dcp.save(sd, checkpoint_id=str(tmp_path / "ckpt" / "step-0000000003"), no_dist=True)
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {"apiVersion": "llmtrain.dev/v1alpha1", "kind": "LLMTrainingJob", "metadata": {"name": "x"}, "spec": spec}
        )
    )

    out = tmp_path / "hf"
    assert main(["export", str(job), "-o", str(out), "--dtype", "fp32", "--max-shard-gb", str(max_shard_gb)]) == 0
    assert "step-0000000003" in capsys.readouterr().out
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_scaling"]["rope_type"] == "llama3" and cfg["eos_token_id"] == 1
    assert (out / "tokenizer.json").exists()
    assert (out / "model.safetensors.index.json").exists() == (max_shard_gb < 1)

    hf = AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="eager").eval()
    tokens = torch.randint(0, 256, (2, 128), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (hf(tokens).logits - model.eval()(tokens)).abs().max().item() < 1e-5


def test_export_without_a_checkpoint_is_a_clear_error(tmp_path, capsys):
    import yaml

    from llmtrain.cli import main

    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "llmtrain.dev/v1alpha1",
                "kind": "LLMTrainingJob",
                "metadata": {"name": "x"},
                "spec": {
                    "model": {"preset": "tiny"},
                    "cluster": {"instanceType": "cpu"},
                    "data": {"seqLen": 32},
                    "checkpoint": {"uri": f"file://{tmp_path}/none"},
                },
            }
        )
    )
    assert main(["export", str(job), "-o", str(tmp_path / "hf")]) == 1
    err = capsys.readouterr().err
    assert "no complete checkpoint at" in err and "Traceback" not in err

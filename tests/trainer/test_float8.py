"""`spec.fsdp.float8`: opt-in float8 training of the transformer blocks' Linear layers (torchao).

Validated against the instance catalog (H100/H200 only), passed to the trainer by the renderer, and
refused by the trainer itself on a device without float8 tensor cores. The float8 matmuls themselves
need such a GPU; `bench/gpu.py` runs them (its `llmtrain/compile/selective/float8` row).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import REPO, base_spec
from llmtrain.backends.pytorchjob import render_pytorchjob
from llmtrain.catalog import instance_types
from llmtrain.validation import check, parse_spec


def _gpu_spec(itype: str, float8: bool = True):
    return parse_spec(
        {
            "model": {"preset": "llama2-7b"},
            "data": {"uri": "s3://b/tokens/", "seqLen": 4096},
            "cluster": {"instanceType": itype, "nodes": 4},
            "fsdp": {"float8": float8, "activationCheckpointing": "full"},
            "training": {"globalBatchTokens": 4096 * 32 * 4},
        }
    )


@pytest.mark.parametrize("itype", ["p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"])
def test_float8_is_accepted_on_h100_and_h200(itype):
    assert [p for p in check(_gpu_spec(itype), "job") if p.field == "spec.fsdp.float8"] == []


@pytest.mark.parametrize("itype", ["p4d.24xlarge", "p4de.24xlarge", "cpu"])
def test_float8_elsewhere_names_the_field_the_reason_and_the_instance_types_that_have_it(itype):
    spec = parse_spec(base_spec(**{"fsdp.float8": True})) if itype == "cpu" else _gpu_spec(itype)
    found = [p for p in check(spec, "job") if p.field == "spec.fsdp.float8"]
    assert len(found) == 1, found
    text = str(found[0])
    assert "float8 tensor cores" in text and "float8: false" in text
    fp8_types = [n for n, t in instance_types().items() if t.gpu.startswith(("H100", "H200"))]
    assert fp8_types and all(n in text for n in fp8_types)
    assert itype not in text.split("instanceType")[-1]  # not offered as an alternative


def test_float8_is_off_by_default_and_in_the_crd():
    assert _gpu_spec("p5.48xlarge", float8=False).fsdp.float8 is False
    assert parse_spec(base_spec()).fsdp.float8 is False
    from llmtrain.crd import crd_manifest

    props = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    fsdp = props["properties"]["fsdp"]["properties"]
    assert fsdp["float8"]["type"] == "boolean" and fsdp["float8"]["default"] is False


def test_render_passes_float8_to_the_trainer():
    obj = render_pytorchjob(_gpu_spec("p5.48xlarge"), "job", "team", default_etcd_endpoint="etcd.infra:2379")
    env = {
        e["name"]: e.get("value")
        for e in obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]
    }
    assert json.loads(env["LLMTRAIN_SPEC"])["fsdp"]["float8"] is True


@pytest.mark.slow  # a trainer process start: ~10 s, more on a loaded machine
def test_trainer_refuses_float8_on_a_cpu_worker(tmp_path):
    """A spec that asks for float8 reaching a worker without a float8 GPU (here: CPU) stops with an
    error naming the field, before it joins the job — not with a failed matmul later."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(base_spec(**{"fsdp.float8": True})))
    env = {
        "PATH": "/usr/bin:/bin",
        "CUDA_VISIBLE_DEVICES": "",
        "LLMTRAIN_LOG_LEVEL": "WARNING",
        "PYTHONPATH": f"{REPO / 'operator'}:{REPO / 'trainer'}",
    }
    out = subprocess.run(
        [sys.executable, "-m", "llmtrain_trainer", "--spec", str(spec)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "spec.fsdp.float8 needs a CUDA GPU" in out.stderr and "runs on cpu" in out.stderr, out.stderr[-2000:]
    assert '"event":"step"' not in out.stdout


def test_check_float8_device_refuses_cpu():
    from llmtrain_trainer.distributed.parallel import check_float8_device

    with pytest.raises(RuntimeError, match=r"spec.fsdp.float8 needs a CUDA GPU"):
        check_float8_device(torch.device("cpu"))


def test_float8_converts_the_block_linears_but_not_lm_head():
    """The module swap (no float8 matmul runs here): every Linear of every block, never lm_head."""
    from llmtrain.spec import resolve_dims
    from llmtrain_trainer.distributed.parallel import convert_float8
    from llmtrain_trainer.models.llama import Llama

    spec = parse_spec(
        base_spec(
            **{
                "model": {
                    "dims": {
                        "hiddenSize": 64,
                        "intermediateSize": 128,
                        "numLayers": 2,
                        "numHeads": 4,
                        "numKvHeads": 2,
                        "vocabSize": 256,
                    }
                }
            }
        )
    )
    with torch.device("meta"):
        model = Llama(resolve_dims(spec.model))
    n = convert_float8(model)
    assert n == 2 * 7  # q, k, v, o, gate, up, down per block
    assert type(model.lm_head).__name__ == "Linear"
    assert all(
        type(m).__name__ == "Float8Linear"
        for name, m in model.named_modules()
        if name.startswith("model.layers.") and name.rsplit(".", 1)[-1].endswith("_proj")
    )

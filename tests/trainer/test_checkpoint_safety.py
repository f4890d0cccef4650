"""A checkpoint is hostile input: whoever can write a job's checkpoint prefix must not get code run
by the job's next automatic resume (every rank, local disk / FSx / S3) or by `llmtrain export`.

Each crafted checkpoint below carries a pickle whose `__reduce__` calls `os.system("touch MARKER")`:
once as the `.metadata` file, once as a non-tensor record (the bytes DCP stores for a plain value).
A load must refuse it with an error naming the file and the refused global, create no marker, and
not quietly resume from an older checkpoint instead. Checkpoints written by today's writer (the
trainer's whole state: model, AdamW state, the train dict, the RNG tensor) still load.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import zipfile

import pytest
import torch
import torch.distributed.checkpoint as dcp
import yaml

pytestmark = pytest.mark.trainer


class Boom:
    """Unpickles to `os.system("touch <marker>")`: the global a pickle names is `posix.system`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _state(value: float, step=None) -> dict:
    return {"model": {"w": torch.full((64,), value)}, "train": {"step": int(value) if step is None else step}}


def _checkpointer(uri: str, events=None):
    from llmtrain_trainer.checkpoint.checkpointer import Checkpointer
    from llmtrain_trainer.job_config import CheckpointConfig

    return Checkpointer(
        CheckpointConfig(uri, keep=5, timeout_minutes=1), emit=(events.append if events is not None else None)
    )


@pytest.fixture(params=["local", "s3"])
def store_uri(request, tmp_path):
    """A checkpoint location of each kind the trainer resumes from (FSx is a local path)."""
    if request.param == "local":
        return str(tmp_path / "ckpt")
    import uuid

    import boto3

    request.getfixturevalue("s3")
    bucket = f"hostile-{uuid.uuid4().hex[:8]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/run"


def _replace_metadata(uri: str, step: int, body: bytes) -> None:
    """What a writer with access to the prefix can do: swap a complete checkpoint's `.metadata`
    (on S3 also the commit marker, so the checkpoint still counts as complete)."""
    name = f"step-{step:010d}"
    if not uri.startswith("s3://"):
        with open(os.path.join(uri, name, ".metadata"), "wb") as f:
            f.write(body)
        return
    import boto3

    c = boto3.client("s3")
    bucket, _, prefix = uri[5:].partition("/")
    base = f"{prefix}/{name}/a0/"
    c.put_object(Bucket=bucket, Key=base + ".metadata", Body=body)
    marker = json.loads(c.get_object(Bucket=bucket, Key=base + "_COMPLETE")["Body"].read())
    marker["files"][".metadata"] = len(body)
    c.put_object(Bucket=bucket, Key=base + "_COMPLETE", Body=json.dumps(marker).encode())


@pytest.mark.parametrize("where", ["metadata", "record"])
def test_resume_refuses_a_checkpoint_that_names_code_and_runs_none_of_it(store_uri, tmp_path, one_process_group, where):
    """Defect: `.metadata` went through `pickle.load` and non-tensor records through
    `torch.load(weights_only=False)`: the marker was created on every rank at resume, and the
    checkpoint was then skipped (or loaded) as if it were merely corrupt."""
    marker = tmp_path / "ran-code"
    ckpt = _checkpointer(store_uri)
    ckpt.save(1, _state(1.0), blocking=True)
    if where == "record":  # today's writer stores the object's pickle as the record "train.step"
        ckpt.save(2, _state(2.0, step=Boom(marker)), blocking=True)
    else:
        ckpt.save(2, _state(2.0), blocking=True)
        _replace_metadata(store_uri, 2, pickle.dumps(Boom(marker)))
    ckpt.close()

    events: list[dict] = []
    ckpt = _checkpointer(store_uri, events)
    try:
        try:
            ckpt.resume(lambda: _state(0.0))
            msg = None
        except Exception as err:
            msg = str(err)
        assert not marker.exists(), "loading the checkpoint ran the code its pickle names"
        assert msg is not None, "a checkpoint naming os.system was loaded or skipped, not refused"
        assert "posix.system" in msg and "step-0000000002" in msg, msg
        assert (".metadata" in msg) if where == "metadata" else ("__0_0.distcp" in msg and "train.step" in msg), msg
        assert "checkpoint-safety" in msg  # where to read what is allowed
        assert not [e for e in events if e["event"] == "checkpoint_skipped"], "refused, not skipped to step 1"
    finally:
        ckpt.close()
    assert not marker.exists()


def _export_job(tmp_path, ckpt: str) -> str:
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
                    "checkpoint": {"uri": f"file://{ckpt}"},
                },
            }
        )
    )
    return str(job)


def _tiny_weights() -> dict:
    from llmtrain.spec import LLMTrainingJobSpec, resolve_dims
    from llmtrain_trainer.models.llama import Llama

    spec = LLMTrainingJobSpec.model_validate(
        {"model": {"preset": "tiny"}, "cluster": {"instanceType": "cpu"}, "data": {"seqLen": 32}}
    )
    torch.manual_seed(0)
    return {k: v.detach().clone() for k, v in Llama(resolve_dims(spec.model)).state_dict().items()}


@pytest.mark.parametrize("where", ["metadata", "record"])
def test_export_refuses_a_checkpoint_that_names_code_and_runs_none_of_it(tmp_path, capsys, where):
    """Defect: `llmtrain export` on a laptop ran the code a checkpoint's pickle names."""
    from llmtrain.cli import main

    marker = tmp_path / "ran-code"
    weights = _tiny_weights()
    if where == "record":  # a parameter stored as a non-tensor record: export reads it as bytes
        weights["model.norm.weight"] = Boom(marker)
    step_dir = tmp_path / "ckpt" / "step-0000000003"
    dcp.save({"model": weights, "train": {"step": 3}}, checkpoint_id=str(step_dir), no_dist=True)
    if where == "metadata":
        (step_dir / ".metadata").write_bytes(pickle.dumps(Boom(marker)))

    rc = main(["export", _export_job(tmp_path, str(tmp_path / "ckpt")), "-o", str(tmp_path / "hf")])
    err = capsys.readouterr().err
    assert not marker.exists(), "export ran the code the checkpoint's pickle names"
    assert rc == 1, err
    assert "posix.system" in err and str(step_dir) in err and "Traceback" not in err, err
    assert (".metadata" in err) if where == "metadata" else "model.norm.weight" in err, err
    assert not (tmp_path / "hf" / "model.safetensors").exists()


def test_metadata_that_points_outside_the_checkpoint_is_refused(tmp_path, one_process_group):
    """Only DCP's own classes, yet hostile: a record's file `../other/__0_0.distcp` would make the
    local reader read another job's files, and the S3 reader write its download outside its cache."""
    ckpt = _checkpointer(str(tmp_path / "ckpt"))
    ckpt.save(1, _state(1.0), blocking=True)
    path = tmp_path / "ckpt" / "step-0000000001" / ".metadata"
    with open(path, "rb") as f:
        md = pickle.load(f)  # the test's own trusted file
    for info in md.storage_data.values():
        info.relative_path = "../../elsewhere/__0_0.distcp"
    path.write_bytes(pickle.dumps(md))
    try:
        with pytest.raises(Exception, match=r"\.\./\.\./elsewhere/__0_0\.distcp") as err:
            ckpt.load(1, _state(0.0))
        assert str(path) in str(err.value)
    finally:
        ckpt.close()


def test_the_whole_trainer_state_written_today_loads_without_an_unrestricted_unpickler(
    tmp_path, one_process_group, monkeypatch
):
    """Compatibility: a checkpoint of the trainer's state (train.py's `state()`: model, AdamW state
    and param_groups, the data position, the RNG state), written by today's writer, loads bit-exactly
    with the restricted reader, and neither `pickle.load` nor `torch.load(weights_only=False)` runs."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from llmtrain_trainer.checkpoint.checkpointer import init_optimizer_state

    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
        opt = torch.optim.AdamW(
            [
                {"params": [model[0].weight, model[1].weight], "weight_decay": 0.1},
                {"params": [model[0].bias, model[1].bias], "weight_decay": 0.0},
            ],
            lr=3e-4,
            betas=(0.9, 0.95),
        )
        return model, opt

    def state(model, opt, step):
        msd, osd = get_state_dict(model, opt)
        return {
            "model": msd,
            "optim": osd,
            "train": {
                "step": step,
                "world_size": 1,
                "data": {"step": step, "samples_consumed": step * 8, "global_batch_seqs": 8},
                "rng": torch.get_rng_state(),
            },
        }

    model, opt = build()
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    ckpt = _checkpointer(str(tmp_path / "ckpt"))
    saved = state(model, opt, 5)
    ckpt.save(5, saved, blocking=True)
    ckpt.close()

    unrestricted = []
    real_torch_load, real_pickle_load = torch.load, pickle.load
    monkeypatch.setattr(
        torch,
        "load",
        lambda *a, **k: (
            (unrestricted.append("torch.load") if k.get("weights_only") is not True else None)
            or real_torch_load(*a, **k)
        ),
    )
    monkeypatch.setattr(pickle, "load", lambda *a, **k: unrestricted.append("pickle.load") or real_pickle_load(*a, **k))
    fresh, fresh_opt = build()

    def empty():
        init_optimizer_state(fresh_opt)
        return state(fresh, fresh_opt, 0)

    ckpt = _checkpointer(str(tmp_path / "ckpt"))
    step, got = ckpt.resume(empty)
    ckpt.close()
    assert step == 5 and unrestricted == []
    assert got["train"] == {**saved["train"], "rng": got["train"]["rng"]} and torch.equal(
        got["train"]["rng"], saved["train"]["rng"]
    )
    assert all(torch.equal(got["model"][k], v) for k, v in saved["model"].items())
    assert got["optim"]["param_groups"] == saved["optim"]["param_groups"]
    for name, st in saved["optim"]["state"].items():
        assert all(torch.equal(got["optim"]["state"][name][k], v) for k, v in st.items())


def _torch_saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_record_loader_takes_plain_values_and_refuses_anything_else():
    from llmtrain_trainer.checkpoint.safety import UnsafeCheckpoint, load_record

    plain = {"lr": 3e-4, "betas": (0.9, 0.95), "fused": None, "params": ["a", "b"], "n": 7, "ok": True}
    assert load_record(_torch_saved(plain), "rec") == plain
    with pytest.raises(UnsafeCheckpoint, match=r"rec: refused global posix\.system"):
        load_record(_torch_saved(Boom("/nonexistent/x")), "rec")
    with pytest.raises(UnsafeCheckpoint, match=r"rec: refused global torch\._utils\._rebuild_tensor_v2"):
        load_record(_torch_saved({"t": torch.zeros(2)}), "rec")  # tensors are tensor records, never bytes
    deflated = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(_torch_saved(plain))) as src,
        zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as dst,
    ):
        for n in src.namelist():
            dst.writestr(n, src.read(n))
    with pytest.raises(UnsafeCheckpoint, match=r"rec: refused .*compressed"):
        load_record(deflated.getvalue(), "rec")


# ---- llmtrain export copies only the dataset's own tokenizer ------------------------------------


def _dataset_naming(tmp_path, tokenizer: str, *, symlink_to=None) -> str:
    """A dataset directory whose index.json names `tokenizer` (what a hostile or careless writer of
    the dataset can put there), beside a real checkpoint."""
    data = tmp_path / "tokens"
    data.mkdir()
    index = {
        "format": "llmtrain-tokens-v1",
        "dtype": "uint16",
        "vocab_size": 256,
        "eos_id": 1,
        "tokenizer": tokenizer,
        "shards": [],
        "documents": 0,
        "tokens": 0,
    }
    (data / "index.json").write_text(json.dumps(index))
    if symlink_to is not None:
        (data / tokenizer).symlink_to(symlink_to)
    return str(data)


@pytest.mark.parametrize("case", ["dotdot", "absolute", "symlink-out", "subdir-dotdot"])
def test_export_refuses_a_tokenizer_outside_the_dataset(tmp_path, capsys, case):
    """Defect: export copied index.json's tokenizer path verbatim (os.path.join(root, name)), so
    `../x`, `/abs/x` or a symlink put any readable file into the directory meant for publishing."""
    from llmtrain.cli import main

    secret = tmp_path / "secret.json"
    secret.write_text('{"aws_secret_access_key": "do-not-publish"}')
    name = {
        "dotdot": "../secret.json",
        "absolute": str(secret),
        "symlink-out": "tokenizer.json",
        "subdir-dotdot": "sub/../../secret.json",
    }[case]
    data = _dataset_naming(tmp_path, name, symlink_to=secret if case == "symlink-out" else None)
    ckpt = tmp_path / "ckpt"
    dcp.save({"model": _tiny_weights()}, checkpoint_id=str(ckpt / "step-0000000001"), no_dist=True)
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
                    "data": {"uri": f"file://{data}", "seqLen": 32},
                    "checkpoint": {"uri": f"file://{ckpt}"},
                },
            }
        )
    )
    out = tmp_path / "hf"
    rc = main(["export", str(job), "-o", str(out)])
    err = capsys.readouterr().err
    published = [p.read_bytes() for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert not any(b"do-not-publish" in t for t in published), "a file from outside the dataset was exported"
    assert rc == 1, err
    assert "index.json" in err and repr(name) in err and "Traceback" not in err, err
    assert not out.exists() or not any(out.iterdir()), "refused before writing anything"


def test_export_copies_the_tokenizer_prepare_wrote(tmp_path):
    """The accepted case: a plain file name, a regular file in the dataset directory (a symlink
    that stays inside it is fine too)."""
    from llmtrain_trainer.cli.export import tokenizer_path
    from llmtrain_trainer.storage import open_storage

    data = _dataset_naming(tmp_path, "tok.json")
    (tmp_path / "tokens" / "tok.json").write_text("{}")
    (tmp_path / "tokens" / "alias.json").symlink_to("tok.json")
    storage = open_storage(f"file://{data}")
    assert tokenizer_path(data, storage, "tok.json") == os.path.realpath(tmp_path / "tokens" / "tok.json")
    assert tokenizer_path(data, storage, "alias.json") == os.path.realpath(tmp_path / "tokens" / "tok.json")
    with pytest.raises(ValueError, match="not a file in the dataset directory"):
        tokenizer_path(data, storage, "missing.json")


def test_checking_a_received_checkpoint_reports_each_step(tmp_path, capsys, one_process_group):
    """`python -m llmtrain_trainer.checkpoint.safety ROOT`: the documented check of a checkpoint
    from someone else; a good step passes, a crafted one is named with its refused global, and
    checking it runs nothing."""
    from llmtrain_trainer.checkpoint.safety import main

    marker = tmp_path / "ran-code"
    ckpt = _checkpointer(str(tmp_path / "ckpt"))
    ckpt.save(1, _state(1.0), blocking=True)
    ckpt.save(2, _state(2.0, step=Boom(marker)), blocking=True)
    ckpt.close()
    assert main([str(tmp_path / "ckpt")]) == 1
    out = capsys.readouterr().out
    assert not marker.exists()
    assert "ok " in out and "step-0000000001: 1 tensor records, 1 value records" in out, out
    assert "REFUSED" in out and "step-0000000002" in out and "posix.system" in out and "train.step" in out, out

"""Fast, in-process checks of the trainer's parts: model size, FLOPs/MFU, data format and order,
prepare, metrics names."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from llmtrain import flops
from llmtrain.catalog import instance_type, model_preset

pytestmark = pytest.mark.trainer


@pytest.mark.parametrize("preset", ["tiny", "llama2-7b", "llama3-8b", "llama2-70b"])
def test_model_parameter_count_matches_catalog_formula(preset):
    from llmtrain_trainer.models.llama import Llama

    dims = model_preset(preset)
    with torch.device("meta"):
        model = Llama(dims)
    assert sum(p.numel() for p in model.parameters()) == flops.num_params(dims)


def test_flops_per_token_and_mfu_match_documented_formula_by_hand():
    """llama2-7b, T = 4096, on p5.48xlarge, computed here from the raw dimensions."""
    from llmtrain_trainer.metrics.throughput import step_throughput

    d, f, L, V, H, T = 4096, 11008, 32, 32000, 32, 4096
    q = d // H
    block = 4 * d * d + 3 * d * f + 2 * d  # Wq, Wk, Wv, Wo (MHA: kv = d) + SwiGLU + 2 norms
    n_total = 2 * V * d + L * block + d
    assert n_total == 6_738_415_616  # the published 6.74 B
    n_matmul = n_total - V * d  # the input embedding is a lookup
    fpt = 6 * n_matmul + 12 * L * H * q * T
    dims = model_preset("llama2-7b")
    assert flops.flops_per_token(dims, T) == fpt

    # A step of 4 Mi tokens in 10 s on 16 nodes × 8 H100s.
    tokens, seconds, devices, peak = 4 * 2**20, 10.0, 128, 989e12
    assert instance_type("p5.48xlarge").peak_flops_per_device == peak
    tp = step_throughput(tokens, seconds, devices, dims, T, peak)
    tps_dev = tokens / seconds / devices
    assert tp.tokens_per_second == pytest.approx(tokens / seconds)
    assert tp.tokens_per_second_per_device == pytest.approx(tps_dev)
    assert tp.tflops_per_device == pytest.approx(tps_dev * fpt / 1e12)
    assert tp.mfu == pytest.approx(tps_dev * fpt / peak)
    assert 0 < tp.mfu < 1


def test_init_is_independent_of_row_sharding():
    """Each shard draws only its rows, yet the shards concatenate to the unsharded tensor."""
    from llmtrain_trainer.models import init

    full = torch.empty(300, 7)
    init.fill_normal_(full, 0.02, "w", seed=3)
    old = init.BLOCK_ELEMENTS
    init.BLOCK_ELEMENTS = 64  # many blocks, so shards straddle block boundaries
    try:
        full_small_blocks = torch.empty(300, 7)
        init.fill_normal_(full_small_blocks, 0.02, "w", seed=3)
        rows = []
        for lo, hi in [(0, 37), (37, 150), (150, 300)]:
            local = torch.empty(hi - lo, 7)
            orig = init.local_rows
            init.local_rows = lambda p, lo=lo, hi=hi, local=local: (local, lo, hi - lo)
            try:
                init.fill_normal_(torch.empty(300, 7), 0.02, "w", seed=3)
            finally:
                init.local_rows = orig
            rows.append(local)
        assert torch.equal(torch.cat(rows), full_small_blocks)
    finally:
        init.BLOCK_ELEMENTS = old
    assert full.std().item() == pytest.approx(0.02, rel=0.15)


def _write_text(tmp_path, n_docs=30):
    src = tmp_path / "text"
    src.mkdir()
    for i in range(n_docs):
        (src / f"doc{i:02d}.txt").write_text(f"document {i}: " + "the quick brown fox jumps. " * (5 + i))
    (src / "more.jsonl").write_text("\n".join(json.dumps({"text": f"line {i} héllo"}) for i in range(5)))
    return src


def test_prepare_byte_level_format(tmp_path):
    from llmtrain_trainer.data.loader import FORMAT
    from llmtrain_trainer.data.prepare import prepare

    src = _write_text(tmp_path)
    out = tmp_path / "tok"
    index = prepare([str(src)], str(out), shard_tokens=1000)
    on_disk = json.loads((out / "index.json").read_text())
    assert on_disk == index
    assert index["format"] == FORMAT and index["dtype"] == "uint16" and index["vocab_size"] == 256
    assert index["documents"] == 35 and index["eos_id"] == 0
    texts = [p.read_text() for p in src.glob("*.txt")]
    expected_tokens = sum(len(t.encode()) + 1 for t in texts) + sum(
        len(f"line {i} héllo".encode()) + 1 for i in range(5)
    )
    assert index["tokens"] == expected_tokens
    assert all(s["tokens"] == 1000 for s in index["shards"][:-1])
    tokens = np.concatenate([np.fromfile(out / s["file"], dtype="<u2") for s in index["shards"]])
    assert len(tokens) == expected_tokens and (tokens == 0).sum() == 35
    decoded = bytes(tokens.astype(np.uint8)).split(b"\0")
    assert sorted(d.decode() for d in decoded if d) == sorted(texts + [f"line {i} héllo" for i in range(5)])


def test_prepare_with_tokenizers_file(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from llmtrain_trainer.data.prepare import prepare

    src = _write_text(tmp_path)
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train([str(p) for p in src.glob("*.txt")], trainers.WordLevelTrainer(special_tokens=["<unk>", "</s>"]))
    tok_file = tmp_path / "tokenizer.json"
    tok.save(str(tok_file))
    index = prepare([str(src)], str(tmp_path / "tok"), tokenizer=str(tok_file))
    assert index["tokenizer"] == "tokenizer.json" and index["eos_id"] == tok.token_to_id("</s>")
    assert index["vocab_size"] == tok.get_vocab_size()
    assert (tmp_path / "tok" / "tokenizer.json").exists()
    ids = np.fromfile(tmp_path / "tok" / index["shards"][0]["file"], dtype="<u2")
    assert tok.decode([int(i) for i in ids[:4]]).split()[0] in ("document", "line")


@pytest.fixture
def shards(tmp_path):
    from llmtrain_trainer.data.prepare import prepare

    prepare([str(_write_text(tmp_path))], str(tmp_path / "tok"), shard_tokens=700)
    return str(tmp_path / "tok")


def test_order_is_a_permutation_per_epoch_and_deterministic(shards):
    from llmtrain_trainer.data import loader as data

    ds = data.ShardDataset(shards, seq_len=16, seed=5)
    n = ds.samples_per_epoch
    assert len(ds.shards) > 3

    def visit(start, count):
        return [(sh, first + k) for sh, first, c in ds.segments(start, count) for k in range(c)]

    epoch0, epoch1 = visit(0, n), visit(n, n)
    assert len(set(epoch0)) == n and set(epoch0) == set(epoch1) and epoch0 != epoch1
    assert visit(0, n) == epoch0
    assert visit(3, 20) == epoch0[3:23]  # resumable: any position reproduces the same samples
    other = data.ShardDataset(shards, seq_len=16, seed=6)
    assert [(sh, f + k) for sh, f, c in other.segments(0, n) for k in range(c)] != epoch0
    # A sample is T+1 consecutive tokens at k·T of its shard.
    sh, first, _ = ds.segments(7, 1)[0]
    raw = np.fromfile(f"{shards}/{ds.shards[sh]['file']}", dtype="<u2")
    assert np.array_equal(ds.read_segment(sh, first, 1)[0], raw[first * 16 : first * 16 + 17])


def test_a_batch_draws_samples_from_across_the_shards(shards):
    """Sample-level shuffling: 16 consecutive samples of the order come from many shards, not from
    one contiguous stretch (which is what a chunk-level order gave for data written in order)."""
    from llmtrain_trainer.data import loader as data

    ds = data.ShardDataset(shards, seq_len=16, seed=0)
    for start in (0, 16, ds.samples_per_epoch - 8):
        picked = [sh for sh, first, c in ds.segments(start, 16) for _ in range(c)]
        assert len(set(picked)) >= min(4, len(ds.shards)), picked


@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 1000, 4097])
def test_permute_is_a_bijection(n):
    from llmtrain_trainer.data.loader import permute

    p = permute(np.arange(n), n, seed=3, epoch=1)
    assert sorted(p.tolist()) == list(range(n))
    assert n < 5 or p.tolist() != list(range(n))


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_rank_parts_tile_the_global_batch_at_any_world_size(shards, dp):
    from llmtrain_trainer.data.loader import DataLoader, ShardDataset

    g, mb = 8, 2
    ref = ShardDataset(shards, seq_len=16, seed=0)
    for step in (0, 1, 5):
        expected = np.concatenate([ref.read_segment(*s) for s in ref.segments(step * g, g)])
        got = []
        for r in range(dp):
            loader = DataLoader(
                ShardDataset(shards, seq_len=16, seed=0),
                global_batch_seqs=g,
                dp_rank=r,
                dp_size=dp,
                micro_batch=mb,
                device=torch.device("cpu"),
                start_step=step,
            )
            micro = loader.next()
            assert len(micro) == g // dp // mb
            got += [torch.cat([x, y[:, -1:]], dim=1) for x, y in micro]
            assert loader.state_dict() == {"step": step + 1, "samples_consumed": (step + 1) * g, "global_batch_seqs": g}
            loader.close()
        assert np.array_equal(torch.cat(got).numpy(), expected)


def test_loader_resumes_at_its_position(shards):
    from llmtrain_trainer.data.loader import DataLoader, ShardDataset

    def make():
        return DataLoader(
            ShardDataset(shards, seq_len=16, seed=0),
            global_batch_seqs=4,
            dp_rank=0,
            dp_size=1,
            micro_batch=2,
            device=torch.device("cpu"),
        )

    a = make()
    batches = [a.next() for _ in range(5)]
    b = make()
    b.load_state_dict({"step": 3, "samples_consumed": 12, "global_batch_seqs": 4})
    for x, y in b.next():  # noqa: B007 - drains the loader; its last batch is checked below
        pass
    assert torch.equal(x, batches[3][-1][0])
    with pytest.raises(ValueError):
        b.load_state_dict({"step": 3, "samples_consumed": 24, "global_batch_seqs": 8})
    a.close(), b.close()


def test_synthetic_samples_do_not_depend_on_the_read_split():
    from llmtrain_trainer.data.loader import SyntheticDataset

    ds = SyntheticDataset(256, 16, seed=1)
    whole = ds.read_segment(0, 10, 8)
    assert np.array_equal(np.concatenate([ds.read_segment(0, 10, 3), ds.read_segment(0, 13, 5)]), whole)
    assert whole.min() >= 0 and whole.max() < 256


def test_s3_reader_reads_the_same_samples(shards, s3):
    import boto3

    from llmtrain_trainer.data.loader import ShardDataset

    c = boto3.client("s3")
    c.create_bucket(Bucket="data")
    import os

    for name in os.listdir(shards):
        c.upload_file(os.path.join(shards, name), "data", f"tok/{name}")
    local, remote = ShardDataset(shards, 16, 0), ShardDataset("s3://data/tok/", 16, 0)
    for seg in local.segments(0, 30):
        assert np.array_equal(local.read_segment(*seg), remote.read_segment(*seg))


EXPECTED_METRICS = {
    "llmtrain_trainer_step": "gauge",
    "llmtrain_trainer_loss": "gauge",
    "llmtrain_trainer_tokens_per_second": "gauge",
    "llmtrain_trainer_tokens_per_second_per_device": "gauge",
    "llmtrain_trainer_tokens": "counter",
    "llmtrain_trainer_tflops_per_device": "gauge",
    "llmtrain_trainer_mfu": "gauge",
    "llmtrain_trainer_step_seconds": "histogram",
    "llmtrain_trainer_data_wait_seconds": "histogram",
    "llmtrain_trainer_memory_allocated_bytes": "gauge",
    "llmtrain_trainer_memory_reserved_bytes": "gauge",
    "llmtrain_trainer_last_checkpoint_step": "gauge",
    "llmtrain_trainer_last_checkpoint_timestamp_seconds": "gauge",
    "llmtrain_trainer_checkpoint_duration_seconds": "histogram",
    "llmtrain_trainer_checkpoint_failures": "counter",
    "llmtrain_trainer_checkpoint_interval_seconds": "gauge",
    "llmtrain_trainer_hang_timeout_seconds": "gauge",
    "llmtrain_trainer_heartbeat_timestamp_seconds": "gauge",
    # per-step loss facts for the operator's health rules (losswatch.py)
    **{
        f"llmtrain_trainer_{n}": "gauge"
        for n in (
            "nonfinite_loss_steps",
            "nonfinite_loss_max_steps",
            "nonfinite_loss_first_step",
            "loss_median",
            "loss_ratio_to_median",
            "loss_spike_step",
            "loss_spike_ratio",
            "resumed_before_step",
        )
    },
    # goodput (llmtrain/goodput.py)
    "llmtrain_trainer_checkpoint_blocking_seconds": "counter",
    "llmtrain_trainer_train_start_timestamp_seconds": "gauge",
    "llmtrain_trainer_resume_step": "gauge",
    "llmtrain_trainer_attempt_steps": "gauge",
    "llmtrain_trainer_attempt_step_seconds": "gauge",
    "llmtrain_trainer_attempt_checkpoint_blocking_seconds": "gauge",
    "llmtrain_trainer_attempt_data_wait_seconds": "gauge",
    "llmtrain_trainer_inplace_restarts": "gauge",
    "llmtrain_trainer_inplace_restart_seconds": "gauge",
    "llmtrain_trainer_inplace_redone_steps": "gauge",
    "llmtrain_trainer_inplace_redone_seconds": "gauge",
    # spec.checkpoint.memory (checkpoint/snapshots.py), and where a process resumed from
    "llmtrain_trainer_snapshot_blocking_seconds": "counter",
    "llmtrain_trainer_last_snapshot_step": "gauge",
    "llmtrain_trainer_resume_tier": "gauge",
    # checkpoint.intervalMinutes auto (llmtrain/cadence.py)
    "llmtrain_trainer_checkpoint_blocking_estimate_seconds": "gauge",
    "llmtrain_trainer_checkpoint_blocking_measured_saves": "gauge",
    "llmtrain_trainer_checkpoint_mtbf_seconds": "gauge",
    # stragglers (llmtrain/stragglers.py): rank 0's window, one series per scored rank
    "llmtrain_trainer_straggler_score": "gauge",
    "llmtrain_trainer_straggler_slowdown": "gauge",
}


def test_metrics_names_types_and_labels():
    from llmtrain_trainer.metrics.prometheus import TrainerMetrics

    m = TrainerMetrics(job="job", rank=3)
    m.tokens_total.inc(5)
    families = {f.name: f for f in m.registry.collect()}
    assert {n: f.type for n, f in families.items()} == EXPECTED_METRICS
    for f in families.values():
        for s in f.samples:
            assert s.labels["llmtrain_job"] == "job" and s.labels["rank"] == "3"
    TrainerMetrics(job="other", rank=0)  # independent registries can coexist


def test_straggler_series_name_the_scored_rank_and_its_node_and_follow_the_window():
    from prometheus_client import generate_latest

    from llmtrain.stragglers import RankScore, parse
    from llmtrain_trainer.metrics.prometheus import TrainerMetrics

    m = TrainerMetrics(job="job", rank=0)
    m.export_stragglers([RankScore(5, "node-b", 1.5, 1.3), RankScore(2, "node-a", 1.0, 1.0)])
    window = parse(generate_latest(m.registry))  # what the operator reads back
    assert window.ranks == (RankScore(5, "node-b", 1.5, 1.3), RankScore(2, "node-a", 1.0, 1.0))
    m.export_stragglers([RankScore(2, "node-a", 1.1, 1.0)])  # rank 5 left the top: its series go
    assert parse(generate_latest(m.registry)).ranks == (RankScore(2, "node-a", 1.1, 1.0),)


def test_lr_schedule_shapes():
    from llmtrain.spec import TrainingSpec
    from llmtrain_trainer.config import lr_at

    t = TrainingSpec(maxSteps=110, warmupSteps=10, learningRate=1e-3, minLearningRate=1e-4)
    assert lr_at(5, t) == pytest.approx(5e-4) and lr_at(10, t) == pytest.approx(1e-3)
    assert lr_at(60, t) == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(110, t) == pytest.approx(1e-4)
    lin = TrainingSpec(maxSteps=110, warmupSteps=10, learningRate=1e-3, lrSchedule="linear")
    assert lr_at(60, lin) == pytest.approx(1e-3 - 0.9e-3 * 0.5)  # floor defaults to lr/10


def test_spec_from_env_wire_json_or_whole_document(tmp_path, monkeypatch):
    from llmtrain_trainer.config import JobIdentity, load_spec

    wire = {"model": {"preset": "tiny"}, "cluster": {"instanceType": "cpu"}, "data": {"seqLen": 64}}
    monkeypatch.setenv("LLMTRAIN_SPEC", json.dumps(wire))
    assert load_spec(None).data.seq_len == 64
    doc = tmp_path / "job.yaml"
    doc.write_text(
        "apiVersion: llmtrain.dev/v1alpha1\nkind: LLMTrainingJob\nmetadata: {name: x}\n"
        "spec:\n  model: {preset: tiny}\n  cluster: {instanceType: cpu}\n  data: {seqLen: 32}\n"
    )
    assert load_spec(str(doc)).data.seq_len == 32  # --spec wins over the env
    monkeypatch.setenv("LLMTRAIN_JOB_NAME", "j")
    monkeypatch.setenv("LLMTRAIN_JOB_NAMESPACE", "ns")
    monkeypatch.setenv("LLMTRAIN_ATTEMPT", "3")
    assert JobIdentity.from_env() == JobIdentity("j", "ns", 3) and JobIdentity.from_env().label == "ns/j"


@pytest.mark.parametrize("shard_tokens", [0, -5])
def test_prepare_rejects_a_shard_size_below_one_token(tmp_path, shard_tokens):
    """Defect: --shard-tokens 0 looped forever writing empty shard files."""
    from llmtrain_trainer.data.prepare import prepare

    out = tmp_path / "tok"
    with pytest.raises(ValueError, match="shard_tokens") as err:
        prepare([str(_write_text(tmp_path))], str(out), shard_tokens=shard_tokens)
    assert "at least 1" in str(err.value)
    assert not out.exists() or not any(out.iterdir())


_PREPARE_PEAK = """
import json, sys, tracemalloc
from llmtrain_trainer.data.prepare import prepare
src, small, out, workers, batch_bytes, shard_tokens = sys.argv[1:]
kw = dict(workers=int(workers), batch_bytes=int(batch_bytes), shard_tokens=int(shard_tokens))
prepare([small], out + "-warm", **kw)  # the modules prepare imports on first use are not its data
tracemalloc.start()
index = prepare([src], out, progress=True, **kw)
print(json.dumps({"peak": tracemalloc.get_traced_memory()[1], "documents": index["documents"],
                  "tokens": index["tokens"]}))
"""


def test_prepare_streams_with_memory_bounded_by_one_shard(tmp_path):
    """The corpus is never held in memory. What prepare may hold at once, from its design: the
    `workers + 2` batches in flight, each as raw records, their pickled copy on the way to a worker,
    the worker's ids (uint16: 2 bytes per byte of text) and their pickled copy on the way back, plus
    one shard buffer and the file's read buffer. The peak of Python/numpy allocations stays within
    that, while the corpus's tokens (40 MB) are over four times more. The whole-corpus version held
    every document and its tokens.

    Measured in a fresh process after a small warm-up run: tracemalloc counts every thread's
    allocations (in a full suite, other tests' server threads allocate too) and, on a first run, the
    modules prepare imports. Workers are set, not taken from the machine's cores, so the bound is
    the same on any machine."""
    import subprocess
    import sys

    from llmtrain_trainer.data.sources import LOCAL_READ_BUFFER

    src = tmp_path / "big.jsonl"
    text = "streaming keeps memory flat. " * 350  # ~10 KB per document
    with open(src, "w") as f:
        for _ in range(2000):
            f.write(json.dumps({"text": text}) + "\n")
    assert src.stat().st_size > 20e6
    small = tmp_path / "small.jsonl"
    small.write_text(json.dumps({"text": "warm"}) + "\n")
    workers, batch, shard = 2, 256 << 10, 1 << 18
    args = [str(a) for a in (src, small, tmp_path / "tok", workers, batch, shard)]
    run = subprocess.run(
        [sys.executable, "-c", _PREPARE_PEAK, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.splitlines()[-1])
    assert got["documents"] == 2000 and got["tokens"] == 2000 * (len(text) + 1)
    per_batch = batch + batch + 2 * batch + 2 * batch  # records, pickled; ids, pickled
    rest = 1 << 20  # the pool, the progress bar, the index
    bound = (workers + 2) * per_batch + 2 * shard + LOCAL_READ_BUFFER + rest
    assert got["tokens"] * 2 > 4 * bound
    assert got["peak"] < bound, f"peak {got['peak'] / 2**20:.1f} MiB, bound {bound / 2**20:.1f} MiB"
    assert "tokenizing" in run.stderr and "100%" in run.stderr  # the progress bar, over the input bytes


def test_prepare_to_s3_uploads_shard_by_shard_and_reads_back_the_same(tmp_path, s3):
    import boto3

    from llmtrain_trainer.data.loader import ShardDataset
    from llmtrain_trainer.data.prepare import prepare

    boto3.client("s3").create_bucket(Bucket="prep")
    src = _write_text(tmp_path)
    local = prepare([str(src)], str(tmp_path / "tok"), shard_tokens=700)
    remote = prepare([str(src)], "s3://prep/tok/", shard_tokens=700)
    assert remote == local and len(remote["shards"]) > 3
    keys = sorted(o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="prep")["Contents"])
    assert keys == sorted(["tok/index.json"] + [f"tok/{s['file']}" for s in local["shards"]])
    a, b = ShardDataset(str(tmp_path / "tok"), 16, 0), ShardDataset("s3://prep/tok/", 16, 0)
    for seg in a.segments(0, 12):
        assert np.array_equal(a.read_segment(*seg), b.read_segment(*seg))


def test_memory_gauge_reads_current_rss_through_a_kept_descriptor():
    """The per-step memory read (CPU: process RSS) follows the process: a fresh /proc read agrees with
    it, and touching 64 MiB more shows up in the next read from the same kept descriptor."""
    import os

    from llmtrain_trainer.metrics.memory import MemoryGauge

    mem = MemoryGauge(torch.device("cpu"))
    try:
        before, reserved = mem.read()
        with open("/proc/self/statm") as f:
            fresh = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        assert before == reserved and abs(before - fresh) < 8 << 20
        block = np.ones(64 << 20, dtype=np.uint8)  # touched: resident
        after, _ = mem.read()
        assert after - before >= 60 << 20, (before, after)
        del block
    finally:
        mem.close()

"""Training data: the token-shard format, a deterministic resumable order, the prefetching loader.

Shards are read through the storage layer (llmtrain_trainer/storage: local/FSx paths and S3 prefixes,
exact ranged reads).

Token-shard format (`llmtrain-tokens/v1`), written by `llmtrain prepare`
-----------------------------------------------------------------------
A directory (local/FSx path or S3 prefix) with

    index.json         {"format": "llmtrain-tokens/v1", "dtype": "uint16" | "uint32",
                        "vocab_size": 256, "eos_id": 0, "tokenizer": "byte" | "<file name>",
                        "shards": [{"file": "shard-00000.bin", "tokens": 52428800}, ...]}
    shard-NNNNN.bin    the token ids as a flat little-endian array of `dtype` (uint16 when the
                       vocabulary fits in 16 bits), documents concatenated, each followed by eos_id

No per-document offsets are needed: training reads fixed windows. Shards are large (default
2^26 tokens = 128 MiB of uint16) so S3 GETs are few and large.

Samples and order
-----------------
Sample k of a shard is the window of T+1 tokens starting at k·T (T = seqLen): inputs are the first
T, targets the last T (next-token shift). A shard of n tokens holds ⌊(n−1)/T⌋ samples.

The global order is an endless sequence of epochs; epoch e visits every sample of every shard once,
in a permutation of the sample ids drawn from (seed, e) — a keyed Feistel bijection (`permute`), so
no permutation table is stored whatever the corpus size. Step s trains on global samples
[s·G, (s+1)·G) where G = globalBatchTokens / T, whatever the world size; data-parallel rank r of R
takes the sub-range [s·G + r·G/R, s·G + (r+1)·G/R). Hence

- the data position is one integer (samples consumed = step·G), stored in every checkpoint, and a
  resumed run — on any number of ranks that divides G — sees exactly the samples it would have seen;
- shuffling is at sample granularity across all shards: a global batch draws its samples from all
  over the corpus, even when the data was tokenized by another tool with documents in order (a
  chunk-level order would make a 4 Mi-token batch one contiguous stretch of one source);
- each rank reads only its own samples, one ranged read per sample (adjacent picks merged), issued
  ahead of time by a bounded thread pool (`prefetch` steps, `workers` concurrent reads): a few
  reads of T+1 tokens per rank and step, small next to a step's compute.

`synthetic` data needs no files: sample i is the arithmetic progression x_t = (a + b·t) mod V with
(a, b) drawn from (seed, i) — learnable (the loss falls), deterministic, free to generate.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

FORMAT = "llmtrain-tokens/v1"
INDEX = "index.json"
# A file an index names: relative, "/"-separated, no "." or ".." part, a bounded length. Indexes and
# the buckets they live in are tenant data: a name must never reach outside the dataset's prefix.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9_][A-Za-z0-9._-]{0,127}){0,3}")


def check_name(name, where: str) -> str:
    """`name` if it is a safe file name inside a dataset, else ValueError naming `where`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name.split("/"):
        raise ValueError(
            f"{where}: {name!r} is not a file name inside the dataset (expected a relative "
            "path of letters, digits, '.', '_', '-', at most 4 levels, no '..')"
        )
    return name


# ----------------------------------------------------------------------------------------------
# Datasets: global sample index → tokens.


class ShardDataset:
    """Pre-tokenized shards in the `llmtrain-tokens/v1` format, in a sample-level shuffled order."""

    def __init__(self, uri: str, seq_len: int, seed: int):
        from ..storage import open_storage  # local or S3, ranged reads (llmtrain_trainer/storage)

        self.storage = open_storage(uri)
        self.index = json.loads(self.storage.read_text(INDEX))
        if self.index.get("format") != FORMAT:
            raise ValueError(f"{uri}: index.json format is {self.index.get('format')!r}, expected {FORMAT!r}")
        self.dtype = np.dtype(self.index["dtype"]).newbyteorder("<")
        self.vocab_size = int(self.index["vocab_size"])
        self.seq_len, self.seed = seq_len, seed
        self.shards = self.index["shards"]
        for k, sh in enumerate(self.shards):
            check_name(sh.get("file") if isinstance(sh, dict) else sh, f"{uri}/{INDEX}: shards[{k}].file")
        per_shard = [max(0, (int(sh["tokens"]) - 1) // seq_len) for sh in self.shards]
        self._first = np.cumsum([0, *per_shard])  # global (unshuffled) index of each shard's sample 0
        self.samples_per_epoch = int(self._first[-1])
        if self.samples_per_epoch == 0:
            raise ValueError(f"{uri}: no complete sample of {seq_len + 1} tokens in any shard")

    def _locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unshuffled sample ids → (shard, sample within the shard)."""
        shard = np.searchsorted(self._first, ids, side="right") - 1
        return shard, ids - self._first[shard]

    def segments(self, start: int, n: int) -> list[tuple[int, int, int]]:
        """Global samples [start, start+n) as (shard, first sample in shard, count) runs, each one
        contiguous range of a file (adjacent picks are merged into one read)."""
        pos = np.arange(start, start + n, dtype=np.int64)
        epoch, j = np.divmod(pos, self.samples_per_epoch)
        ids = np.empty(n, dtype=np.int64)
        for e in np.unique(epoch):
            sel = epoch == e
            ids[sel] = permute(j[sel], self.samples_per_epoch, self.seed, int(e))
        shard, local = self._locate(ids)
        out: list[tuple[int, int, int]] = []
        for sh, lo in zip(shard.tolist(), local.tolist(), strict=True):
            if out and out[-1][0] == sh and out[-1][1] + out[-1][2] == lo:
                out[-1] = (sh, out[-1][1], out[-1][2] + 1)
            else:
                out.append((sh, lo, 1))
        return out

    def read_segment(self, shard: int, first: int, count: int) -> np.ndarray:
        """`count` consecutive samples of one shard with a single read of count·T + 1 tokens."""
        t, item = self.seq_len, self.dtype.itemsize
        raw = self.storage.read_range(self.shards[shard]["file"], first * t * item, (count * t + 1) * item)
        flat = np.frombuffer(raw, dtype=self.dtype)
        # Windows of T+1 overlapping by one token: sample k = flat[k·T : k·T + T + 1].
        return np.lib.stride_tricks.as_strided(flat, shape=(count, t + 1), strides=(t * item, item)).astype(np.int64)

    def close(self) -> None:
        self.storage.close()


def permute(j: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """A keyed bijection of [0, n) (vectorised): position j of epoch `epoch` → sample id.

    A 4-round Feistel network on the smallest even number of bits covering n, with round keys from
    (seed, epoch, round); values that land in [n, 2^bits) are fed through again ("cycle walking")
    until they fall inside [0, n), which keeps it a bijection of [0, n). No permutation table is
    stored (O(1) memory for any corpus) and the data position stays one integer.
    """
    bits = max(2, int(n - 1).bit_length())
    bits += bits % 2
    half = bits // 2
    mask = np.uint64((1 << half) - 1)
    x = j.astype(np.uint64)
    todo = np.ones(len(x), dtype=bool)
    with np.errstate(over="ignore"):
        while todo.any():
            v = x[todo]
            left, right = v >> np.uint64(half), v & mask
            for r in range(4):
                f = _mix64(right, seed, (epoch << 8) | r) & mask
                left, right = right, left ^ f
            v = (left << np.uint64(half)) | right
            x[todo] = v
            todo[todo] = v >= np.uint64(n)
    return x.astype(np.int64)


class SyntheticDataset:
    """Deterministic learnable sequences; no I/O (benchmarks, smoke tests)."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        self.samples_per_epoch = 1 << 62

    def segments(self, start: int, n: int) -> list[tuple[int, int, int]]:
        return [(0, start, n)]

    def read_segment(self, shard: int, first: int, count: int) -> np.ndarray:
        # (a, b) of sample i come from a hash of (seed, i) alone, so a sample's tokens don't depend
        # on which rank or which read produced it (world-size independence, like the shard order).
        i = np.arange(first, first + count, dtype=np.uint64)
        h1, h2 = _mix64(i, self.seed, 1), _mix64(i, self.seed, 2)
        a = (h1 % np.uint64(self.vocab_size)).astype(np.int64)[:, None]
        b = (1 + h2 % np.uint64(min(self.vocab_size - 1, 7))).astype(np.int64)[:, None]
        t = np.arange(self.seq_len + 1, dtype=np.int64)[None, :]
        return (a + b * t) % self.vocab_size

    def close(self) -> None:
        pass


def _mix64(x: np.ndarray, seed: int, salt: int) -> np.ndarray:
    """splitmix64 finaliser of x + (seed, salt): a cheap, well-mixed per-element hash."""
    with np.errstate(over="ignore"):
        z = x + np.uint64((seed * 0x9E3779B97F4A7C15 + salt * 0xBF58476D1CE4E5B9) & (2**64 - 1))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def open_dataset(uri: str, seq_len: int, seed: int, vocab_size: int):
    if uri == "synthetic":
        return SyntheticDataset(vocab_size, seq_len, seed)
    ds = ShardDataset(uri, seq_len, seed)
    if ds.vocab_size > vocab_size:
        raise ValueError(f"{uri}: token vocabulary {ds.vocab_size} exceeds the model's {vocab_size}")
    return ds


# ----------------------------------------------------------------------------------------------
# The loader: this rank's micro-batches for each step, prefetched.


class DataLoader:
    """Yields, for each step, this rank's list of micro-batches (inputs, targets), each of shape
    (micro_batch, T). Position = next step; `state_dict()` is part of the checkpoint."""

    def __init__(
        self,
        dataset,
        *,
        global_batch_seqs: int,
        dp_rank: int,
        dp_size: int,
        micro_batch: int,
        device: torch.device,
        prefetch: int = 2,
        workers: int = 4,
        start_step: int = 0,
    ):
        if global_batch_seqs % (dp_size * micro_batch):
            raise ValueError(
                f"global batch of {global_batch_seqs} sequences is not divisible by "
                f"{dp_size} ranks × microBatchSize {micro_batch}"
            )
        self.ds = dataset
        self.g, self.rank, self.dp = global_batch_seqs, dp_rank, dp_size
        self.per_rank = global_batch_seqs // dp_size
        self.micro_batch = micro_batch
        self.accum = self.per_rank // micro_batch
        self.device = device
        self.prefetch = max(1, prefetch)
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="llmtrain-data")
        self.step = start_step
        self._pending: dict[int, Future] = {}
        self.last_wait = 0.0

    # A rank's samples for a step: a contiguous range of the global order.
    def rank_range(self, step: int) -> tuple[int, int]:
        return step * self.g + self.rank * self.per_rank, self.per_rank

    def _load(self, step: int) -> np.ndarray:
        start, n = self.rank_range(step)
        parts = [self.ds.read_segment(*seg) for seg in self.ds.segments(start, n)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _schedule(self) -> None:
        for s in range(self.step, self.step + self.prefetch + 1):
            if s not in self._pending:
                self._pending[s] = self.pool.submit(self._load, s)

    def next(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        self._schedule()
        t0 = time.perf_counter()
        arr = self._pending.pop(self.step).result()
        self.last_wait = time.perf_counter() - t0
        self.step += 1
        self._schedule()
        import torch  # here, not at import: `llmtrain prepare`'s worker processes read FORMAT without torch

        batch = torch.from_numpy(arr)
        if self.device.type == "cuda":
            batch = batch.pin_memory().to(self.device, non_blocking=True)
        return [(mb[:, :-1], mb[:, 1:]) for mb in batch.split(self.micro_batch)]

    def rewind(self) -> None:
        """Give back the last step's batch (a stop in the middle of the step): it is read again."""
        self.step -= 1

    def state_dict(self) -> dict:
        return {"step": self.step, "samples_consumed": self.step * self.g, "global_batch_seqs": self.g}

    def load_state_dict(self, sd: dict) -> None:
        if int(sd["global_batch_seqs"]) != self.g:
            raise ValueError(
                f"checkpoint was written with {sd['global_batch_seqs']} sequences per step, "
                f"this run uses {self.g}: the data position would not line up"
            )
        for f in self._pending.values():
            f.cancel()
        self._pending.clear()
        self.step = int(sd["step"])

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)  # reads in flight finish before files close
        self.ds.close()

"""Where checkpoints live, and how one becomes complete: the local/FSx and the S3 checkpoint stores.

Both sit on the storage layer (llmtrain_trainer/storage), which does the I/O, its retries and its
errors; a store adds the checkpoint layout, DCP's writer and reader for it, and the commit.

Layout, under spec.checkpoint.uri:

    step-0000001000/   .metadata  __0_0.distcp  __1_0.distcp ...     complete checkpoints only
    .partial-step-0000002000/                                         (local) being written
    step-0000002000/a<attempt>/   (S3) objects without _COMPLETE      being written
    quarantine/step-0000003000/                                       set aside by a loss-spike rollback

Atomicity: a checkpoint becomes visible only once every rank has written its part. DCP gathers
all ranks' write results on rank 0 before calling the storage writer's `finish`, so `finish` on
rank 0 is the one place that knows the checkpoint is whole; it then commits:
- local / FSx: write into `.partial-step-N/`, then rename it to `step-N/` (atomic in POSIX);
- S3: each rank writes its shard file to a node-local staging directory and uploads it in its
  `write_data` (the background thread; a 70B shard upload never stalls training); `finish` uploads
  `.metadata` and then the `_COMPLETE` marker object. Readers ignore directories without a valid marker.

S3 loads read only what this rank needs: after planning, the reader knows the byte ranges of its
items in each `__r_k.distcp` file and fetches each file's needed span with one ranged GET
(bounded parallelism) into a sparse local file, which the file reader then reads.

Both readers read tensor records straight into the state being loaded (reader.py), not through
DCP's per-record `torch.load`; the files are the ones DCP's writer always wrote.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from ..config import local_path, staging_dir
from ..storage import LocalStorage, S3Storage, StorageError
from .reader import DirectFileReader

log = logging.getLogger(__name__)

STEP_RE = re.compile(r"^step-(\d{10})$")
ATTEMPT_RE = re.compile(r"^a(\d+)$")
QUARANTINE = "quarantine"
MARKER = "_COMPLETE"
METADATA = ".metadata"


def step_name(step: int) -> str:
    return f"step-{step:010d}"


def _free_name(name: str, exists: Callable[[str], bool]) -> str:
    """`name`, or `name.2`, `name.3`... : the first that does not exist yet."""
    candidate, n = name, 1
    while exists(candidate):
        n += 1
        candidate = f"{name}.{n}"
    return candidate


def _needed_spans(reader: FileSystemReader, plan) -> dict[str, list[int]]:
    """File → [first byte, end] of the items this rank's load plan reads from it."""
    spans: dict[str, list[int]] = {}
    for item in plan.items:
        info = reader.storage_data[item.storage_index]
        lo, hi = spans.setdefault(info.relative_path, [info.offset, info.offset + info.length])
        spans[info.relative_path] = [min(lo, info.offset), max(hi, info.offset + info.length)]
    return spans


def open_store(uri: str, attempt: int = 0, staging: str | None = None):
    """The checkpoint store at `uri` (s3://... or a local/FSx path); `staging`: node-local scratch
    for S3 transfers (None: config.staging_dir())."""
    if uri.startswith("s3://"):
        return S3Store(uri, attempt, staging)
    return LocalStore(local_path(uri))


# ----------------------------------------------------------------------------------------------
# Local / FSx store.


class _LocalWriter(FileSystemWriter):
    def __init__(self, fs: LocalStorage, partial: str, final: str, on_commit: Callable[[], None]):
        super().__init__(fs.path(partial), single_file_per_rank=True, sync_files=True)
        self._fs, self._partial, self._final, self._on_commit = fs, partial, final, on_commit

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)
        old = None
        if os.path.exists(self._fs.path(self._final)):  # a re-save of the same step: move the old one aside first
            old = f".old-{self._final}"
            self._fs.rename(self._final, old)
        self._fs.rename(self._partial, self._final)
        if old:
            self._fs.remove_tree(old)
        self._on_commit()


class _LocalReader(DirectFileReader):
    def read_data(self, plan, planner):
        # The reader works item by item (resolving each destination, parsing each record's head)
        # between its reads: telling the kernel up front which bytes this rank needs lets it read
        # them ahead in the background, so the disk does not idle meanwhile.
        for rel, (lo, hi) in _needed_spans(self, plan).items():
            try:
                fd = os.open(os.path.join(self.path, rel), os.O_RDONLY)
            except OSError:
                continue  # DCP's own read reports it
            try:
                os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
        return super().read_data(plan, planner)


class LocalStore:
    """Checkpoints as directories under a local or FSx path; a rename commits one."""

    def __init__(self, root: str):
        self.fs = LocalStorage(root)
        self.root = self.fs.root

    def __str__(self) -> str:
        return self.root

    def check_writable(self) -> None:
        """Create the directory and write, sync and remove a probe file (raises StorageError)."""
        self.fs.check_writable()

    def list_complete(self) -> list[int]:
        if not os.path.isdir(self.root):
            return []
        return sorted(
            int(m.group(1))
            for n in os.listdir(self.root)
            if (m := STEP_RE.match(n)) and os.path.exists(self.fs.path(f"{n}/{METADATA}"))
        )

    def writer(self, step: int, rank: int, on_commit: Callable[[], None]):
        os.makedirs(self.root, exist_ok=True)
        return _LocalWriter(self.fs, f".partial-{step_name(step)}", step_name(step), on_commit)

    def reader(self, step: int, rank: int):
        return _LocalReader(self.fs.path(step_name(step)))

    def delete(self, step: int) -> None:
        self.fs.remove_tree(step_name(step))

    def quarantine(self, step: int) -> str:
        """Move the complete checkpoint `step` aside (a rename: instant at any size)."""
        os.makedirs(self.fs.path(QUARANTINE), exist_ok=True)
        dest = _free_name(f"{QUARANTINE}/{step_name(step)}", lambda n: os.path.exists(self.fs.path(n)))
        self.fs.rename(step_name(step), dest)
        return self.fs.path(dest)

    def discard_partial(self, step: int) -> None:
        """What a failed save of `step` left behind (never the committed step directory)."""
        self.fs.remove_tree(f".partial-{step_name(step)}")

    def clean_partials(self) -> None:
        if os.path.isdir(self.root):
            for n in os.listdir(self.root):
                if n.startswith((".partial-", ".old-")):
                    self.fs.remove_tree(n)

    def finish_load(self, rank: int) -> None:
        pass

    def locations(self) -> None:
        return None

    def adopt(self, locations) -> None:
        pass


# ----------------------------------------------------------------------------------------------
# S3 store.


class _S3Writer(FileSystemWriter):
    def __init__(self, store: S3Store, step: int, rank: int, on_commit: Callable[[], None]):
        self._staging = os.path.join(store.staging, f"{os.getpid()}-{step_name(step)}-r{rank}")
        shutil.rmtree(self._staging, ignore_errors=True)
        super().__init__(self._staging, single_file_per_rank=True, sync_files=False)
        self._store, self._step, self._on_commit = store, step, on_commit
        self._attempt = store.attempt

    def prepare_global_plan(self, plans):
        # Rank 0, before any rank writes: a re-save of this step by this same attempt (a re-run of
        # `llmtrain local`) first withdraws the old marker, so old metadata never vouches for new shards.
        self._store.s3.delete([self._store.name(self._step, self._attempt, MARKER)])
        return super().prepare_global_plan(plans)

    def write_data(self, plan, planner):
        fut = super().write_data(plan, planner)
        results = fut.wait()  # a torch.futures.Future, already completed by the file writer
        files = sorted({r.storage_data.relative_path for r in results})
        for f in files:  # one file per rank in single_file_per_rank mode: one multipart upload
            self._store.s3.upload(os.path.join(self._staging, f), self._store.name(self._step, self._attempt, f))
            os.remove(os.path.join(self._staging, f))
        return fut

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)
        # The commit marker names its attempt and every object the checkpoint consists of, with the
        # size each must have: a checkpoint is complete only if all of them are there (see
        # S3Store.list_complete), so shards deleted under a late writer can never look complete.
        files: dict[str, int] = {}
        for per_rank in results:
            for r in per_rank:
                sd = r.storage_data
                files[sd.relative_path] = max(files.get(sd.relative_path, 0), sd.offset + sd.length)
        meta_path = os.path.join(self._staging, METADATA)
        files[METADATA] = os.path.getsize(meta_path)
        s3, name = self._store.s3, self._store.name
        s3.upload(meta_path, name(self._step, self._attempt, METADATA))
        marker = {"step": self._step, "attempt": self._attempt, "time": time.time(), "files": files}
        s3.write(name(self._step, self._attempt, MARKER), json.dumps(marker).encode())
        shutil.rmtree(self._staging, ignore_errors=True)
        self._on_commit()


class _S3Reader(DirectFileReader):
    def __init__(self, store: S3Store, step: int, attempt: int, cache: str):
        shutil.rmtree(cache, ignore_errors=True)
        os.makedirs(cache)
        super().__init__(cache, source=store.s3.url(store.dir(step, attempt)))
        self._store, self._step, self._attempt, self._cache = store, step, attempt, cache

    def read_metadata(self, *args, **kwargs):
        self._store.s3.download(
            self._store.name(self._step, self._attempt, METADATA), os.path.join(self._cache, METADATA)
        )
        return super().read_metadata(*args, **kwargs)

    def read_data(self, plan, planner):
        spans = _needed_spans(self, plan)

        def fetch(rel: str) -> None:
            lo, hi = spans[rel]
            data = self._store.s3.read_range(self._store.name(self._step, self._attempt, rel), lo, hi - lo)
            with open(os.path.join(self._cache, rel), "wb") as f:  # sparse: only [lo, hi) holds data
                f.seek(lo)
                f.write(data)

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(fetch, spans))
        return super().read_data(plan, planner)


class S3Store:
    """Checkpoints under s3://bucket/prefix/step-NNNNNNNNNN/a<attempt>/.

    Fencing by attempt: every attempt writes only under its own `a<attempt>/` directory, and a step
    is complete only through a commit marker that names the attempt and lists every object with its
    size. A new attempt may therefore delete uncommitted directories at start-up while the previous
    attempt's pods, still in their grace period, keep uploading: whatever the old writer commits
    afterwards is either whole (all listed objects present) or not complete — never a checkpoint
    that looks complete over deleted shards.
    """

    def __init__(self, uri: str, attempt: int = 0, staging: str | None = None):
        self.s3 = S3Storage(uri)
        self.uri = self.s3.uri
        self.attempt = attempt
        self.staging = staging or staging_dir()
        self.owner: dict[int, int] = {}  # complete step → the attempt whose directory holds it

    def __str__(self) -> str:
        return self.uri

    @staticmethod
    def dir(step: int, attempt: int) -> str:
        return f"{step_name(step)}/a{attempt}/"

    def name(self, step: int, attempt: int, file: str) -> str:
        return self.dir(step, attempt) + file

    def check_writable(self) -> None:
        """PUT and DELETE a probe object under the prefix (raises StorageError)."""
        self.s3.check_writable()

    def _objects(self) -> dict[tuple[int, int], dict[str, int]]:
        """(step, attempt) → {object name: size} for everything under the prefix."""
        out: dict[tuple[int, int], dict[str, int]] = {}
        for e in self.s3.list():
            parts = e.name.split("/", 2)
            if len(parts) == 3 and (m := STEP_RE.match(parts[0])) and (a := ATTEMPT_RE.match(parts[1])):
                out.setdefault((int(m.group(1)), int(a.group(1))), {})[parts[2]] = e.size
        return out

    def _committed(self, step: int, attempt: int, names: dict[str, int]) -> bool:
        if MARKER not in names:
            return False
        where = self.s3.url(self.name(step, attempt, MARKER))
        try:
            marker = json.loads(self.s3.read(self.name(step, attempt, MARKER), limit=names[MARKER]))
            files = marker["files"]
        except (ValueError, KeyError, TypeError, StorageError) as err:
            log.warning("%s: unreadable commit marker, ignored: %s", where, err)
            return False
        if marker.get("attempt") != attempt or marker.get("step") != step:
            return False
        missing = [f for f, size in files.items() if names.get(f, -1) < size]
        if missing:
            log.warning(
                "%s: commit marker of attempt %d lists objects that are missing or short (%s): "
                "not a complete checkpoint",
                self.s3.url(self.dir(step, attempt)),
                attempt,
                ", ".join(missing[:4]),
            )
            return False
        return True

    def list_complete(self) -> list[int]:
        self.owner = {}
        for (step, attempt), names in sorted(self._objects().items()):
            if self._committed(step, attempt, names):
                self.owner[step] = attempt  # sorted: the newest attempt that committed the step wins
        return sorted(self.owner)

    def locations(self) -> dict[int, int]:
        return dict(self.owner)

    def adopt(self, locations: dict[int, int]) -> None:
        self.owner = dict(locations)

    def writer(self, step: int, rank: int, on_commit: Callable[[], None]):
        return _S3Writer(self, step, rank, on_commit)

    def reader(self, step: int, rank: int):
        return _S3Reader(self, step, self.owner.get(step, self.attempt), self._cache_dir(step, rank))

    def _cache_dir(self, step: int, rank: int) -> str:
        return os.path.join(self.staging, f"{os.getpid()}-load-{step_name(step)}-r{rank}")

    def finish_load(self, rank: int) -> None:
        for n in os.listdir(self.staging):
            if n.startswith(f"{os.getpid()}-load-"):
                shutil.rmtree(os.path.join(self.staging, n), ignore_errors=True)

    def _delete_dir(self, prefix: str) -> None:
        """Every object under `prefix`; markers first, so a checkpoint being deleted is never seen
        as complete-but-partial."""
        names = [e.name for e in self.s3.list(prefix)]
        self.s3.delete(
            [n for n in names if n.endswith("/" + MARKER)] + [n for n in names if not n.endswith("/" + MARKER)]
        )

    def delete(self, step: int) -> None:
        self._delete_dir(f"{step_name(step)}/")

    def quarantine(self, step: int) -> str:
        """Copy every object of `step` (all attempts) under quarantine/step-N/ (server-side,
        multipart for large shards), then delete the originals, markers first."""
        src = f"{step_name(step)}/"
        dest = _free_name(f"{QUARANTINE}/{step_name(step)}", lambda n: bool(self.s3.list(n + "/"))) + "/"
        for e in self.s3.list(src):
            self.s3.copy(e.name, dest + e.name[len(src) :])
        self._delete_dir(src)
        return self.s3.url(dest)

    def discard_partial(self, step: int) -> None:
        pass  # uncommitted objects are never loaded; the next attempt's start-up removes them

    def clean_partials(self) -> None:
        """Remove every attempt directory without a valid commit (also one a previous attempt may
        still be writing: fencing makes that safe, see the class docstring)."""
        for (step, attempt), names in self._objects().items():
            if not self._committed(step, attempt, names):
                self._delete_dir(self.dir(step, attempt))

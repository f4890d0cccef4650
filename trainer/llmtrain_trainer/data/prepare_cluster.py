"""The distributed `llmtrain prepare`: the same prepare as a Kubernetes Indexed Job, one slice per index.

    llmtrain prepare --cluster s3://corpus/ -o s3://tokens/run1/ --indexes 16 [--apply]
        lists the corpus once, writes `manifest.json` (the sorted file list, each index's slice, the
        settings) and the tokenizer to the output, and prints (or creates) the Job
    pod k:  llmtrain prepare --manifest s3://tokens/run1/manifest.json     (k = $JOB_COMPLETION_INDEX)
        prepares its slice into `<output>/<part k>/` — shards and the part's own index.json, written
        last — then merges if every part is complete
    llmtrain prepare --status NAME     the Job's succeeded / failed indexes and whether the merge is done

Why a CLI-rendered Job and not an `LLMDataset` resource: a prepare is a finite batch computation
with nothing to reconcile after it ends, and Kubernetes' Indexed Job already gives per-index
completion, per-index retries (backoffLimitPerIndex), a failure policy (a bad record fails its index
at once instead of being retried) and a status that names the completed indexes. A CRD would add
an operator state machine in front of the same Job; it is worth it when datasets become objects
other resources refer to (a job waiting on its dataset), not before.

Slices: index k takes the files whose first byte falls in [k·B/K, (k+1)·B/K) of the corpus' B bytes
in the manifest's order — contiguous, so the parts concatenated in index order are the corpus in
the single-machine order. A file is never split across indexes.

Spread prefixes: part k lives under `<4 hex digits of sha256(k)>-<k:05d>/`, so the parts' keys
differ in their first characters below the output prefix and S3 can partition them apart (each
S3 prefix serves ≈3,500 PUT/s; a part writes a few).

Re-runs: a part whose index.json exists and names this manifest's digest is complete and skipped;
a part without it is prepared again from the start (its shards are overwritten in place).

The merge writes `<output>/index.json`: the parts' shards in index order, each name prefixed with
its part's directory, documents and tokens summed. "Equals the single-machine output" means: the
same token stream (all shards concatenated in index order), hence the same documents in the same
order, the same document and token counts, dtype, vocabulary, eos and tokenizer. Only where the
stream is cut into shard files differs: each part's last shard is short.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from .loader import FORMAT, INDEX, check_name
from .sources import (
    DEFAULT_EXTENSIONS,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_TEXT_FIELD,
    Source,
    list_sources,
)

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "llmtrain-prepare-manifest/v1"
MAX_MANIFEST_BYTES = 256 << 20
MAX_INDEXES = 10000  # Kubernetes' limit on an Indexed Job with backoffLimitPerIndex is 10^5; bounded lower
EXIT_BAD_INPUT = 3  # the pod failure policy fails the index at once: a bad record does not get better


def part_dir(k: int) -> str:
    return f"{hashlib.sha256(str(k).encode()).hexdigest()[:4]}-{k:05d}/"


def slices(sizes: list[int], k: int) -> list[tuple[int, int]]:
    """[start, end) of the files of each of k indexes: contiguous, balanced by bytes."""
    import bisect

    total, pos, owner = sum(sizes), 0, []
    for s in sizes:  # the index whose byte range holds the file's first byte: non-decreasing
        owner.append(min(k - 1, pos * k // total) if total else 0)
        pos += s
    bounds = [bisect.bisect_left(owner, i) for i in range(k + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(k)]


# ----------------------------------------------------------------------------------------------
# Storage of small JSON/text objects in the output (a directory or an S3 prefix).


def _join(output: str, name: str) -> str:
    if output.startswith("s3://"):
        return output.rstrip("/") + "/" + name
    from ..config import local_path

    return os.path.join(local_path(output), name)


def read_object(output: str, name: str, limit: int = MAX_MANIFEST_BYTES) -> bytes | None:
    """The bytes of `output`/`name`, None if it does not exist; refused past `limit` bytes."""
    from ..storage import open_storage

    try:
        return open_storage(output).read(name, limit)
    except FileNotFoundError:  # S3's NotFound is one too
        return None


def write_object(output: str, name: str, data: bytes) -> None:
    """Create or replace `output`/`name`, atomically: readers never see half an index."""
    from ..storage import open_storage

    open_storage(output).write(name, data)


def parse_json(data: bytes, where: str) -> dict:
    try:
        doc = json.loads(data)
    except ValueError as err:
        raise ValueError(f"{where}: not JSON ({err})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: not a JSON object")
    return doc


# ----------------------------------------------------------------------------------------------
# Plan, per-index run, merge.


def plan(
    inputs: list[str],
    output: str,
    *,
    indexes: int,
    tokenizer: str | None = None,
    eos_id: int | None = None,
    shard_tokens: int,
    extensions=DEFAULT_EXTENSIONS,
    text_field: str = DEFAULT_TEXT_FIELD,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> dict:
    """List the corpus once and write manifest.json (and the tokenizer) to `output`; the manifest.
    Every index reads this one listing, so the slices cannot drift if the bucket changes."""
    from .tokenizer import Tokenizer

    if not 1 <= indexes <= MAX_INDEXES:
        raise ValueError(f"--indexes must be 1..{MAX_INDEXES}, got {indexes}")
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be at least 1 (got {shard_tokens})")
    tok = Tokenizer.load(tokenizer, eos_id)
    sources = list_sources(inputs, extensions)
    cuts = slices([s.size for s in sources], indexes)
    manifest = {
        "format": MANIFEST_FORMAT,
        "indexes": indexes,
        "tokenizer": tok.name,
        "eos_id": tok.eos_id,
        "tokenizer_sha256": hashlib.sha256(tok.json.encode()).hexdigest() if tok.json else None,
        "shard_tokens": shard_tokens,
        "text_field": text_field,
        "max_record_bytes": max_record_bytes,
        "sources": [{"uri": s.uri, "size": s.size} for s in sources],
        "slices": [list(c) for c in cuts],
    }
    if tok.json:
        write_object(output, tok.name, tok.json.encode())
    write_object(output, MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest


@dataclass
class Manifest:
    doc: dict
    digest: str
    sources: list[Source]

    @classmethod
    def read(cls, output: str) -> Manifest:
        where = _join(output, MANIFEST)
        data = read_object(output, MANIFEST)
        if data is None:
            raise FileNotFoundError(f"{where}: no manifest (written by `llmtrain prepare --cluster`)")
        doc = parse_json(data, where)
        if doc.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"{where}: format {doc.get('format')!r}, expected {MANIFEST_FORMAT!r}")
        try:
            k = int(doc["indexes"])
            sources = [Source(str(s["uri"]), int(s["size"])) for s in doc["sources"]]
            cuts = [(int(a), int(b)) for a, b in doc["slices"]]
            int(doc["shard_tokens"]), int(doc["eos_id"]), str(doc["text_field"]), int(doc["max_record_bytes"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{where}: malformed ({err!r})") from None
        if output.startswith("s3://") and any(not s.uri.startswith("s3://") for s in sources):
            # a manifest in a bucket must not make the pods read their own local files into the output
            raise ValueError(f"{where}: an s3:// output's manifest may list only s3:// sources")
        if len(cuts) != k or any(not 0 <= a <= b <= len(sources) for a, b in cuts):
            raise ValueError(f"{where}: slices do not cover the {len(sources)} sources in {k} indexes")
        if doc["tokenizer"] != "byte":
            check_name(doc["tokenizer"], f"{where}: tokenizer")
        return cls(doc, hashlib.sha256(data).hexdigest(), sources)

    @property
    def indexes(self) -> int:
        return int(self.doc["indexes"])

    def slice(self, k: int) -> list[Source]:
        a, b = self.doc["slices"][k]
        return self.sources[a:b]

    def tokenizer(self, output: str):
        from .tokenizer import Tokenizer

        name = self.doc["tokenizer"]
        if name == "byte":
            return Tokenizer.load(None, int(self.doc["eos_id"]))
        data = read_object(output, name)
        if data is None or hashlib.sha256(data).hexdigest() != self.doc["tokenizer_sha256"]:
            raise ValueError(f"{_join(output, name)}: missing, or not the tokenizer the manifest was planned with")
        return Tokenizer.from_json(
            data.decode("utf-8", errors="replace"), name, int(self.doc["eos_id"]), _join(output, name)
        )


def part_index(output: str, k: int) -> dict | None:
    data = read_object(output, part_dir(k) + INDEX)
    return None if data is None else parse_json(data, _join(output, part_dir(k) + INDEX))


def run_index(output: str, k: int, *, workers: int | None = None, progress: bool = False) -> dict:
    """Prepare index k's slice into its part (skipped when already complete), then try the merge.
    Returns {"index", "skipped", "part": the part's index, "merged": the merged index or None}."""
    from .prepare import run_prepare

    m = Manifest.read(output)
    if not 0 <= k < m.indexes:
        raise ValueError(f"index {k} is outside 0..{m.indexes - 1} of {_join(output, MANIFEST)}")
    done = part_index(output, k)
    skipped = bool(done and (done.get("part") or {}).get("manifest") == m.digest)
    report = None
    if not skipped:
        result = run_prepare(
            None,
            _join(output, part_dir(k)),
            tok=m.tokenizer(output),
            sources=m.slice(k),
            shard_tokens=int(m.doc["shard_tokens"]),
            text_field=m.doc["text_field"],
            max_record_bytes=int(m.doc["max_record_bytes"]),
            workers=workers,
            progress=progress,
            copy_tokenizer=False,
            extra={"part": {"index": k, "of": m.indexes, "manifest": m.digest}},
        )
        done, report = result.index, result.report
    return {"index": k, "skipped": skipped, "part": done, "report": report, "merged": merge(output, m)}


def merge(output: str, m: Manifest | None = None) -> dict | None:
    """Write `output`/index.json from the parts when every part is complete; the merged index, or None
    while parts are missing. Idempotent: every index's last step calls it, and whichever sees all
    parts (S3 is read-after-write consistent, so the last writer at least does) writes the same bytes."""
    m = m or Manifest.read(output)
    parts = []
    for k in range(m.indexes):
        part = part_index(output, k)
        if not part or (part.get("part") or {}).get("manifest") != m.digest:
            return None
        parts.append(part)
    shards: list[dict] = []
    documents = 0
    for k, part in enumerate(parts):
        where = _join(output, part_dir(k) + INDEX)
        if (
            part.get("format") != FORMAT
            or part.get("tokenizer") != m.doc["tokenizer"]
            or part.get("eos_id") != m.doc["eos_id"]
            or part.get("dtype") != parts[0].get("dtype")
        ):
            raise ValueError(f"{where}: not a part of this manifest's dataset (format, tokenizer, eos or dtype differ)")
        for j, sh in enumerate(part.get("shards") or []):
            name = check_name(sh.get("file") if isinstance(sh, dict) else None, f"{where}: shards[{j}].file")
            tokens = sh.get("tokens")
            if not isinstance(tokens, int) or tokens < 1:
                raise ValueError(f"{where}: shards[{j}].tokens must be a positive integer, got {tokens!r}")
            shards.append({"file": part_dir(k) + name, "tokens": tokens})
        documents += int(part.get("documents") or 0)
    first = parts[0]
    index = {
        "format": FORMAT,
        "dtype": first["dtype"],
        "vocab_size": first["vocab_size"],
        "eos_id": first["eos_id"],
        "tokenizer": first["tokenizer"],
        "documents": documents,
        "tokens": sum(s["tokens"] for s in shards),
        "shards": shards,
        "parts": m.indexes,
    }
    write_object(output, INDEX, json.dumps(index, indent=1).encode())
    return index


# ----------------------------------------------------------------------------------------------
# The Job.

JOB_LABEL = "llmtrain.dev/prepare"
OUTPUT_ANNOTATION = "llmtrain.dev/prepare-output"
CONTAINER = "prepare"


def job_name(output: str) -> str:
    return "prepare-" + hashlib.sha256(output.encode()).hexdigest()[:10]


def render_job(
    output: str,
    indexes: int,
    *,
    name: str | None = None,
    namespace: str = "default",
    parallelism: int | None = None,
    image: str | None = None,
    cpus: int = 16,
    memory_gib: int = 32,
    service_account: str | None = None,
    env: dict[str, str] | None = None,
    backoff_per_index: int = 3,
) -> dict:
    """The Indexed Job: pod k runs index k of the manifest in `output` (the trainer image's CLI)."""
    from llmtrain.catalog import instance_type
    from llmtrain.render import container_security_context, pod_security_context
    from llmtrain.spec import DEFAULT_IMAGE

    name = name or job_name(output)
    labels = {"app.kubernetes.io/name": "llmtrain-prepare", "app.kubernetes.io/managed-by": "llmtrain", JOB_LABEL: name}
    container = {
        "name": CONTAINER,
        "image": image or DEFAULT_IMAGE,
        "command": ["llmtrain", "prepare", "--manifest", _join(output, MANIFEST), "--workers", str(cpus)],
        "env": [{"name": k, "value": v} for k, v in sorted((env or {}).items())],
        "resources": {
            "requests": {"cpu": str(cpus), "memory": f"{memory_gib}Gi"},
            "limits": {"memory": f"{memory_gib}Gi"},
        },
        # /tmp holds at most two shards on their way to S3 (2 × 2^26 tokens × 4 bytes at most)
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": {**container_security_context(instance_type("cpu")), "readOnlyRootFilesystem": True},
    }
    if not container["env"]:
        del container["env"]
    pod = {
        "restartPolicy": "Never",
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}}],
        "automountServiceAccountToken": False,
    }
    if service_account:  # IRSA / Pod Identity: the S3 role comes with the ServiceAccount
        pod["serviceAccountName"] = service_account
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {OUTPUT_ANNOTATION: output},
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": indexes,
            "parallelism": min(indexes, parallelism or indexes),
            "backoffLimitPerIndex": backoff_per_index,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailIndex",
                        "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [EXIT_BAD_INPUT]},
                    }
                ]
            },
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def _ranges_count(text: str | None) -> tuple[int, list[int]]:
    """Kubernetes' "1,3-5" index sets → (count, sorted indexes)."""
    out: list[int] = []
    for part in (text or "").split(","):
        if not part:
            continue
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    return len(out), out


def job_status(job: dict) -> dict:
    """What `llmtrain prepare --status` reports, from the Job object alone."""
    spec, st = job.get("spec") or {}, job.get("status") or {}
    done, done_ix = _ranges_count(st.get("completedIndexes"))
    failed, failed_ix = _ranges_count(st.get("failedIndexes"))
    conds = {c["type"]: c for c in st.get("conditions") or [] if c.get("status") == "True"}
    phase = "Complete" if "Complete" in conds else "Failed" if "Failed" in conds else "Running"
    return {
        "name": job["metadata"]["name"],
        "indexes": spec.get("completions"),
        "succeeded": done,
        "succeeded_indexes": done_ix,
        "failed": failed,
        "failed_indexes": failed_ix,
        "active": st.get("active", 0),
        "phase": phase,
        "output": (job["metadata"].get("annotations") or {}).get(OUTPUT_ANNOTATION),
        "reason": (conds.get("Failed") or {}).get("message"),
    }


def status_lines(st: dict, merged: dict | str | None) -> list[str]:
    def ranges(ix: list[int]) -> str:
        return ",".join(str(i) for i in ix) if len(ix) <= 20 else f"{ix[0]}..{ix[-1]}"

    lines = [
        f"{st['name']}: {st['phase']}, {st['succeeded']} of {st['indexes']} indexes succeeded"
        + (f" ({ranges(st['succeeded_indexes'])})" if st["succeeded_indexes"] else "")
        + f", {st['failed']} failed"
        + (f" ({ranges(st['failed_indexes'])})" if st["failed_indexes"] else "")
        + f", {st['active']} running"
    ]
    if st.get("reason"):
        lines.append(f"  {st['reason']}")
    if isinstance(merged, dict):
        lines.append(
            f"  merged {_join(st['output'], INDEX)}: {merged['documents']:,} documents, "
            f"{merged['tokens']:,} tokens in {len(merged['shards'])} shards"
        )
    elif merged is None:
        lines.append(f"  {_join(st['output'] or '?', INDEX)}: not merged yet")
    else:
        lines.append(f"  merged index: {merged}")
    return lines

"""The distributed prepare: the Job's indexes run as its pods would (each with JOB_COMPLETION_INDEX,
against a moto S3), then the merge, compared with the single-machine prepare of the same corpus;
re-runs; hostile parts; and the rendered Job's objects and status on the dev cluster."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from test_prepare_inputs import DOCS, _write_format
from test_prepare_parallel import bpe  # noqa: F401  (fixture)

pytestmark = pytest.mark.trainer


def cli(capsys, *argv, env=None, monkeypatch=None) -> tuple[int, str, str]:
    from llmtrain.cli import main

    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def corpus_bucket(s3, tmp_path):
    """s3://corpus/data/: 7 files of every format, the documents of each known in order."""
    import boto3

    c = boto3.client("s3")
    c.create_bucket(Bucket="corpus")
    files = [
        ("a/000.parquet", ".parquet"),
        ("a/001.jsonl.zst", ".jsonl.zst"),
        ("b/002.jsonl", ".jsonl"),
        ("b/003.jsonl.gz", ".jsonl.gz"),
        ("c/004.parquet", ".parquet"),
        ("c/005.jsonl", ".jsonl"),
        ("d/006.jsonl.zst", ".jsonl.zst"),
    ]
    for k, (rel, fmt) in enumerate(files):
        p = tmp_path / rel.replace("/", "_")
        _write_format(p, fmt, [f"<{k}> {d}" for d in DOCS[: 10 + 4 * k]])
        c.upload_file(str(p), "corpus", f"data/{rel}")
    yield "s3://corpus/data/"


def _stream(storage_uri: str, index: dict) -> np.ndarray:
    from llmtrain_trainer.storage import open_storage

    st = open_storage(storage_uri)
    item = np.dtype(index["dtype"]).itemsize
    return np.concatenate(
        [
            np.frombuffer(st.read_range(s["file"], 0, s["tokens"] * item), dtype="<" + index["dtype"][0] + str(item))
            for s in index["shards"]
        ]
    )


def _keys(bucket: str, prefix: str = "") -> dict[str, str]:
    import boto3

    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"]: o["ETag"] + str(o["LastModified"]) for p in pages for o in p.get("Contents", [])}


def test_the_jobs_indexes_merge_to_the_single_machine_output(capsys, tmp_path, corpus_bucket, bpe):  # noqa: F811
    import boto3

    from llmtrain_trainer.data.loader import ShardDataset
    from llmtrain_trainer.data.prepare import prepare

    boto3.client("s3").create_bucket(Bucket="tokens")
    single = prepare([corpus_bucket], "s3://tokens/single/", tokenizer=bpe, shard_tokens=600, workers=1)

    rc, out, err = cli(
        capsys,
        "prepare",
        "--cluster",
        corpus_bucket,
        "-o",
        "s3://tokens/dist/",
        "--indexes",
        "3",
        "--tokenizer",
        bpe,
        "--shard-tokens",
        "600",
        "--cpus",
        "2",
    )
    assert rc == 0, err
    job = yaml.safe_load(out)
    assert job["kind"] == "Job" and job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 3
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["llmtrain", "prepare"] and "s3://tokens/dist/manifest.json" in command

    # The pods, in any order, each with its JOB_COMPLETION_INDEX (as the Job controller sets it).
    import os

    for k in (2, 0, 1):
        os.environ["JOB_COMPLETION_INDEX"] = str(k)
        try:
            rc, out, err = cli(capsys, *command[1:], "--quiet")
        finally:
            del os.environ["JOB_COMPLETION_INDEX"]
        assert rc == 0, err
        assert ("merged s3://tokens/dist/index.json" in out) == (k == 1), out

    merged = json.loads(boto3.client("s3").get_object(Bucket="tokens", Key="dist/index.json")["Body"].read())
    # "equals": the same token stream, documents, counts, dtype, vocabulary, eos and tokenizer
    for key in ("format", "dtype", "vocab_size", "eos_id", "tokenizer", "documents", "tokens"):
        assert merged[key] == single[key], key
    assert merged["documents"] == sum(10 + 4 * k for k in range(7))
    assert np.array_equal(_stream("s3://tokens/dist/", merged), _stream("s3://tokens/single/", single))
    # three parts under spread prefixes, each with shards; the tokenizer beside the merged index
    parts = sorted({s["file"].split("/")[0] for s in merged["shards"]})
    assert len(parts) == 3 and len({p[:4] for p in parts}) == 3
    assert "dist/tokenizer.json" in _keys("tokens", "dist/")
    # the trainer's loader reads it unchanged
    ds = ShardDataset("s3://tokens/dist/", 16, 0)
    assert ds.samples_per_epoch > 10 and ds.read_segment(*ds.segments(0, 1)[0]).shape == (1, 17)

    # A re-run skips completed indexes: no object rewritten.
    before = _keys("tokens", "dist/")
    os.environ["JOB_COMPLETION_INDEX"] = "1"
    try:
        rc, out, err = cli(capsys, *command[1:], "--quiet")
    finally:
        del os.environ["JOB_COMPLETION_INDEX"]
    assert rc == 0 and "already complete, skipped" in out
    after = _keys("tokens", "dist/")
    assert {k: v for k, v in after.items() if not k.endswith("dist/index.json")} == {
        k: v for k, v in before.items() if not k.endswith("dist/index.json")
    }
    # An index whose part index.json is gone (a pod killed before its last write) is prepared again.
    part0 = next(k for k in before if k.endswith("/index.json") and "-00000/" in k)
    boto3.client("s3").delete_object(Bucket="tokens", Key=part0)
    rc, out, err = cli(capsys, *command[1:], "--index", "0", "--quiet")
    assert rc == 0 and "skipped" not in out
    again = json.loads(boto3.client("s3").get_object(Bucket="tokens", Key="dist/index.json")["Body"].read())
    assert again == merged


def test_slices_are_contiguous_balanced_and_cover_every_file():
    from llmtrain_trainer.data.prepare_cluster import slices

    sizes = [5, 1, 1, 1, 10, 2, 2, 2, 2, 2, 1]
    for k in range(1, 15):
        cuts = slices(sizes, k)
        assert len(cuts) == k and cuts[0][0] == 0 and cuts[-1][1] == len(sizes)
        assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))  # contiguous, in order
    # 29 bytes; the files start at 0,5,6,7,8 | 18 | 20,22,24,26,28; index k takes the starts in [29k/3, 29(k+1)/3)
    assert slices(sizes, 3) == [(0, 5), (5, 6), (6, 11)]
    assert slices([0, 0], 2) == [(0, 2), (2, 2)]


def test_more_indexes_than_files_leaves_empty_parts_that_merge(capsys, tmp_path, corpus_bucket):
    import boto3

    from llmtrain_trainer.data.prepare import prepare
    from llmtrain_trainer.data.prepare_cluster import merge, plan, run_index

    boto3.client("s3").create_bucket(Bucket="tokens")
    plan([corpus_bucket + "a/"], "s3://tokens/few/", indexes=5, shard_tokens=1000)
    results = [run_index("s3://tokens/few/", k, workers=1) for k in range(5)]
    assert [bool(r["merged"]) for r in results] == [False] * 4 + [True]
    single = prepare([corpus_bucket + "a/"], str(tmp_path / "single"), shard_tokens=1000, workers=1)
    merged = merge("s3://tokens/few/")
    assert merged["documents"] == single["documents"] and merged["tokens"] == single["tokens"]


def test_merge_refuses_a_part_that_names_a_file_outside_the_dataset(tmp_path):
    """Parts live in a tenant's bucket: a shard name must not reach outside the output."""
    from llmtrain_trainer.data.prepare_cluster import INDEX, merge, part_dir, plan, run_index

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("one document")
    out = str(tmp_path / "out")
    plan([str(src)], out, indexes=1, shard_tokens=100)
    run_index(out, 0, workers=1)
    part = tmp_path / "out" / part_dir(0) / INDEX
    doc = json.loads(part.read_text())
    doc["shards"][0]["file"] = "../../../etc/passwd"
    part.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"shards\[0\]\.file.*not a file name inside the dataset"):
        merge(out)


@pytest.mark.parametrize("name", ["../secret.bin", "/etc/passwd", "a/../../b", "x\\..\\y", ""])
def test_the_loader_refuses_an_index_naming_a_file_outside_the_dataset(tmp_path, name):
    from llmtrain_trainer.data.loader import FORMAT, ShardDataset

    (tmp_path / "index.json").write_text(
        json.dumps(
            {
                "format": FORMAT,
                "dtype": "uint16",
                "vocab_size": 256,
                "eos_id": 0,
                "shards": [{"file": name, "tokens": 100}],
            }
        )
    )
    with pytest.raises(ValueError, match="not a file name inside the dataset"):
        ShardDataset(str(tmp_path), 8, 0)


def test_a_bad_record_fails_its_index_with_the_failure_policys_exit_code(capsys, tmp_path):
    """Exit 3 = FailIndex in the Job's podFailurePolicy: a bad record is not retried."""
    from llmtrain_trainer.data.prepare_cluster import EXIT_BAD_INPUT, render_job

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text('{"text": "ok"}\n{"text": 1}\n')
    out = str(tmp_path / "out")
    rc, _, err = cli(capsys, "prepare", "--cluster", str(src), "-o", out, "--indexes", "1", "--allow-local-output")
    assert rc == 0, err
    rc, _, err = cli(capsys, "prepare", "--manifest", out + "/manifest.json", "--index", "0", "--quiet")
    assert rc == EXIT_BAD_INPUT == 3 and "a.jsonl:2" in err
    rule = render_job("s3://x/y/", 2)["spec"]["podFailurePolicy"]["rules"][0]
    assert rule["action"] == "FailIndex" and rule["onExitCodes"]["values"] == [EXIT_BAD_INPUT]


def test_the_rendered_job_runs_on_the_cluster_and_its_status_is_reported(capsys, dev_cluster, namespace, s3, tmp_path):
    """The Job controller makes one pod per index; the pods of indexes 0 and 1 finish (set here
    as a kubelet would, there are no nodes), and `--status` reports what the Job's status says."""
    import time

    import boto3
    from kubernetes import client

    boto3.client("s3").create_bucket(Bucket="tokens")
    src = tmp_path / "src"
    src.mkdir()
    for k in range(3):
        (src / f"{k}.txt").write_text(f"document {k} " * 50)
    kc = str(dev_cluster.kubeconfig)
    rc, out, err = cli(
        capsys,
        "prepare",
        "--cluster",
        str(src),
        "-o",
        "s3://tokens/k8s/",
        "--indexes",
        "3",
        "--name",
        "prep",
        "-n",
        namespace,
        "--apply",
        "--kubeconfig",
        kc,
    )
    assert rc == 0 and f"job {namespace}/prep created" in out, err
    rc, _, err = cli(
        capsys,
        "prepare",
        "--cluster",
        str(src),
        "-o",
        "s3://tokens/k8s/",
        "--indexes",
        "3",
        "--name",
        "prep",
        "-n",
        namespace,
        "--apply",
        "--kubeconfig",
        kc,
    )
    assert rc == 1 and "exists" in err

    with dev_cluster.api_client() as api:
        core = client.CoreV1Api(api)

        def pods():
            return {
                p.metadata.annotations.get("batch.kubernetes.io/job-completion-index"): p
                for p in core.list_namespaced_pod(namespace, label_selector="job-name=prep").items
            }

        deadline = time.monotonic() + 60
        while len(pods()) < 3:
            assert time.monotonic() < deadline, "the Job controller made no pods"
            time.sleep(0.2)
        spec = pods()["0"].spec
        assert spec.containers[0].command[:3] == ["llmtrain", "prepare", "--manifest"]
        assert spec.security_context.run_as_non_root and spec.restart_policy == "Never"
        for k in ("0", "1"):  # what the kubelet reports when the container exits 0
            core.patch_namespaced_pod_status(
                pods()[k].metadata.name,
                namespace,
                {
                    "status": {
                        "phase": "Succeeded",
                        "containerStatuses": [
                            {
                                "name": "prepare",
                                "image": spec.containers[0].image,
                                "imageID": "",
                                "ready": False,
                                "restartCount": 0,
                                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                            }
                        ],
                    }
                },
            )
        batch = client.BatchV1Api(api)
        deadline = time.monotonic() + 60
        while batch.read_namespaced_job("prep", namespace).status.completed_indexes != "0,1":
            assert time.monotonic() < deadline, batch.read_namespaced_job("prep", namespace).status
            time.sleep(0.2)

    rc, out, err = cli(capsys, "prepare", "--status", "prep", "-n", namespace, "--kubeconfig", kc)
    assert rc == 0, err
    assert "2 of 3 indexes succeeded (0,1)" in out and "0 failed" in out and "not merged yet" in out, out
    rc, out, err = cli(capsys, "prepare", "--status", "nope", "-n", namespace, "--kubeconfig", kc)
    assert rc == 1 and "nope" in err and "Not Found" in err


def test_a_manifest_in_a_bucket_cannot_make_the_pods_read_their_own_files(tmp_path, s3):
    """The manifest is tenant data in S3: listing /etc/hostname-like local paths must be refused."""
    import boto3

    from llmtrain_trainer.data.prepare_cluster import MANIFEST, run_index

    boto3.client("s3").create_bucket(Bucket="evil")
    (tmp_path / "secret.txt").write_text("pod-local secret")
    manifest = {
        "format": "llmtrain-prepare-manifest/v1",
        "indexes": 1,
        "tokenizer": "byte",
        "eos_id": 0,
        "tokenizer_sha256": None,
        "shard_tokens": 100,
        "text_field": "text",
        "max_record_bytes": 1000,
        "sources": [{"uri": str(tmp_path / "secret.txt"), "size": 16}],
        "slices": [[0, 1]],
    }
    boto3.client("s3").put_object(Bucket="evil", Key=f"out/{MANIFEST}", Body=json.dumps(manifest).encode())
    with pytest.raises(ValueError, match="only s3:// sources"):
        run_index("s3://evil/out/", 0, workers=1)

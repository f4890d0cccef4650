"""Rendered worker pods against the real Pod Security admission of the dev cluster's kube-apiserver:
a server-side dry run (`kubectl create --dry-run=server`) of each pod template in namespaces
labelled `pod-security.kubernetes.io/enforce=<level>`. CPU jobs must pass `restricted`; EFA GPU
jobs pass `privileged` and are refused by `baseline` for IPC_LOCK (README "Pod Security")."""

from __future__ import annotations

import json
import uuid

import pytest

from llmtrain.backends.pytorchjob import render_pytorchjob
from llmtrain.catalog import instance_type
from llmtrain.render import pss_level
from llmtrain.validation import parse_spec

pytestmark = [pytest.mark.slow]

LEVELS = ("privileged", "baseline", "restricted")
JOBS = {
    "cpu": {
        "model": {"preset": "tiny"},
        "cluster": {"instanceType": "cpu", "processesPerNode": 2},
        "fsdp": {"mixedPrecision": "fp32"},
        "rendezvous": {"backend": "c10d"},
    },
    "p5.48xlarge": {
        "model": {"preset": "llama2-7b"},
        "data": {"uri": "s3://b/tokens/", "seqLen": 4096},
        "cluster": {"instanceType": "p5.48xlarge", "nodes": 2, "serviceAccountName": "llmtrain-trainer"},
    },
    "p4de.24xlarge": {"model": {"preset": "llama2-7b"}, "cluster": {"instanceType": "p4de.24xlarge"}},
}


@pytest.fixture(scope="module")
def pss_namespaces(dev_cluster):
    """One namespace per Pod Security level (enforce), with the ServiceAccounts the jobs name."""
    suffix = uuid.uuid4().hex[:6]
    names = {level: f"pss-{level}-{suffix}" for level in LEVELS}
    for level, ns in names.items():
        dev_cluster.kubectl("create", "namespace", ns)
        dev_cluster.kubectl(
            "label",
            "namespace",
            ns,
            f"pod-security.kubernetes.io/enforce={level}",
            "pod-security.kubernetes.io/enforce-version=latest",
        )
        # Pods need their ServiceAccount to exist (the ServiceAccount admission plugin checks).
        for sa in ("default", "llmtrain-trainer"):
            dev_cluster.kubectl("create", "serviceaccount", sa, "-n", ns, check=False)
    yield names
    for ns in names.values():
        dev_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def worker_pod(job: str, namespace: str) -> dict:
    obj = render_pytorchjob(
        parse_spec(JOBS[job]),
        f"psa-{job.split('.')[0]}",
        namespace,
        default_etcd_endpoint="etcd.llmtrain-system.svc:2379",
    )
    template = obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{obj['metadata']['name']}-worker-0",
            "namespace": namespace,
            "labels": template["metadata"]["labels"],
        },
        "spec": template["spec"],
    }


def dry_run(dev_cluster, pod: dict):
    return dev_cluster.kubectl(
        "create", "--dry-run=server", "-o", "name", "-f", "-", input=json.dumps(pod), check=False
    )


@pytest.mark.parametrize("job", list(JOBS))
def test_worker_pods_meet_their_documented_level_and_no_stricter_one_lets_them_in(dev_cluster, pss_namespaces, job):
    level = pss_level(instance_type(JOBS[job]["cluster"]["instanceType"]))
    assert level == ("restricted" if job == "cpu" else "privileged")
    for candidate in LEVELS:
        r = dry_run(dev_cluster, worker_pod(job, pss_namespaces[candidate]))
        if LEVELS.index(candidate) <= LEVELS.index(level):
            assert r.returncode == 0, f"{job} refused at {candidate}: {r.stderr}"
            assert r.stdout.strip().startswith("pod/")
        else:
            assert r.returncode != 0, f"{job} accepted at {candidate}, stricter than documented {level}"
            assert "violates PodSecurity" in r.stderr and "IPC_LOCK" in r.stderr, r.stderr

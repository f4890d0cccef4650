"""A deleted job's node faults still count in the node MTBF of `checkpoint.intervalMinutes: auto`,
and still after an operator restart: the operator, as a real process against the real API server,
keeps them in its ConfigMap (controller/adapters/retired.py). Before it, the MTBF came from the cached jobs'
statuses alone, so deleting a job forgot its failures."""

from __future__ import annotations

import json
import uuid

import yaml

from llmtrain.controller.adapters import retired
from llmtrain.spec import GROUP, PLURAL, VERSION
from llmtrain_devcluster.process import free_port

from .conftest import OperatorProcess, wait_for


def _auto_job(name: str) -> dict:
    with open("examples/llama2-7b-p5.yaml") as f:
        doc = yaml.safe_load(f)
    doc["metadata"] = {"name": name}
    doc["spec"]["checkpoint"]["intervalMinutes"] = "auto"
    return doc


def _reason(kube, namespace: str, name: str) -> str:
    ck = wait_for(lambda: kube.status(namespace, name).get("checkpoint"), 30, f"{name}'s status.checkpoint")
    return ck["reason"]


def test_a_deleted_jobs_node_faults_still_count_and_after_a_restart(dev_cluster, kube, namespace, tmp_path):
    cm = f"reliability-{uuid.uuid4().hex[:6]}"
    args = ["--reliability-configmap", cm, "--reliability-namespace", namespace]
    # A job that ran on p5 and blamed two nodes for hardware faults (attempts 1 and 2), its status as
    # the operator wrote it; no operator runs yet, so nothing rewrites it.
    kube.apply(namespace, _auto_job("gone"))
    bad = [
        {"node": "n1", "reason": "XID 79", "xid": 79, "attempt": 1, "time": "2026-12-01T00:00:00Z"},
        {"node": "n2", "reason": "EFA error", "attempt": 2, "time": "2026-12-01T01:00:00Z"},
    ]
    status = {"phase": "Failed", "attempt": 2, "badNodes": bad}
    kube.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "gone", {"status": status})
    uid = kube.job(namespace, "gone")["metadata"]["uid"]

    op = OperatorProcess(dev_cluster.kubeconfig, tmp_path / "operator.log", free_port(), args)
    op.start()
    try:
        kube.apply(namespace, _auto_job("while-it-exists"))
        assert "prior + 2 failures" in _reason(kube, namespace, "while-it-exists")
        kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "gone")

        def ledger() -> dict:
            data = (kube.core.read_namespaced_config_map(cm, namespace).data or {}).get(retired.KEY)
            return json.loads(data) if data else {}

        saved = wait_for(lambda: uid in ledger().get("uids", []) and ledger(), 30, "the deleted job in the ledger")
        assert saved["instances"]["p5.48xlarge"][namespace][0] == 2
        kube.apply(namespace, _auto_job("after-the-deletion"))
        assert "prior + 2 failures" in _reason(kube, namespace, "after-the-deletion")
    finally:
        op.stop()
    op = OperatorProcess(dev_cluster.kubeconfig, tmp_path / "operator-2.log", free_port(), args)
    op.start()
    try:
        kube.apply(namespace, _auto_job("after-a-restart"))
        assert "prior + 2 failures" in _reason(kube, namespace, "after-a-restart")
    finally:
        op.stop()

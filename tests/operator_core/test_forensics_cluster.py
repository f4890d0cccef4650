"""status.flightRecorder against the real API server and the operator as a process: an attempt that
times out (start-up timeout; the hang path uses the same amend, see test_forensics_units) names
where its ranks' NCCL flight recorder dumps are."""

from __future__ import annotations

import time

P5_FSX = {
    "model": {"preset": "llama2-7b"},
    "data": {"uri": "s3://b/tokens/", "seqLen": 4096},
    "cluster": {
        "instanceType": "p5.48xlarge",
        "nodes": 2,
        "volumes": [{"name": "fsx", "claimName": "fsx-claim", "mountPath": "/mnt/fsx"}],
    },
    "training": {"globalBatchTokens": 4096 * 16 * 8},
    "checkpoint": {"uri": "file:///mnt/fsx/ckpt/fr/"},
    "resilience": {"startupTimeoutMinutes": 30, "maxRestarts": 2},
}


def test_a_timed_out_attempt_names_its_flight_recorder_dumps(operator, kube, namespace):
    kube.apply(namespace, kube.job_doc("fr", P5_FSX))
    ptj = kube.wait_ptj(namespace, "fr-a1")
    env = {
        e["name"]: e.get("value")
        for e in ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/mnt/fsx/ckpt/fr/flight-recorder/attempt-1/rank_"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    # No nodes in this cluster: attempt 1 never starts. Pretend it was created two hours ago, once
    # the operator has recorded it (the PyTorchJob is created first; a patch before the record
    # would be overwritten by it).
    kube.wait_phase(namespace, "fr", "Pending")
    two_hours_ago = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 7200))
    kube.custom.patch_namespaced_custom_object_status(
        "llmtrain.dev",
        "v1alpha1",
        namespace,
        "llmtrainingjobs",
        "fr",
        {"status": {"attemptCreationTime": two_hours_ago}},
    )
    kube.wait_ptj(namespace, "fr-a2")
    status = kube.status(namespace, "fr")
    assert status["attempt"] == 2 and status["reason"] == "StartupTimeout"
    assert status["flightRecorder"] == {
        "attempt": 1,
        "reason": "startup-timeout",
        "persistent": True,
        "note": "beside the checkpoints",
        "path": "/mnt/fsx/ckpt/fr/flight-recorder/attempt-1/rank_<rank>",
    }
    events = [e.message for e in kube.core.list_namespaced_event(namespace).items if e.reason == "Restarting"]
    assert any("/mnt/fsx/ckpt/fr/flight-recorder/attempt-1/rank_<rank>" in m for m in events), events

"""The Kubeflow Trainer v2 peer (llmtrain_devcluster.trainer_v2, scripts/install-peer-tools.sh).

The pure parts run in ``make test``: the cache key agrees with the script's and leaves the dev-cluster
tools key alone (JobSet, which the chain runs too, is in the tools key); the JSON patches the modules'
kustomizations use are applied as RFC 6902 says; JobSet's webhooks (from ``make tools``) keep their
release patches. The parts that need the built Trainer are marked ``peer``: ``make test-peer`` builds
it (``make peer-tools``, a bench-only build) and runs those tests."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from llmtrain_devcluster import jobset, tools
from llmtrain_devcluster.trainer_v2 import _KEY_FILES, peer_tools_dir, trainer_webhook_configurations
from llmtrain_devcluster.webhooks import apply_json_patch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install-peer-tools.sh"


def _script_key_files() -> tuple[str, ...]:
    m = re.search(r"^KEY_FILES=\(([^)]*)\)", SCRIPT.read_text(), re.M)
    assert m, "KEY_FILES=(...) not found in install-peer-tools.sh"
    return tuple(m.group(1).split())


def test_peer_key_files_match_the_script_and_stay_out_of_the_tools_key():
    assert _script_key_files() == _KEY_FILES
    # Pinning or bumping Trainer/JobSet must not rebuild kube-apiserver & co. (the tools cache key).
    assert not set(_KEY_FILES) & set(tools._KEY_FILES)
    assert not any(f.startswith("trainer/") for f in tools._KEY_FILES)
    # The JobSet controller is the chain's (make tools), pinned in the one tools module.
    assert {"k8s/go.mod", "k8s/go.sum"} <= set(tools._KEY_FILES)
    assert re.search(r"^\s*sigs.k8s.io/jobset v", (REPO / "tools" / "k8s" / "go.mod").read_text(), re.M)


def test_json_patch_add_replace_remove():
    doc = {"metadata": {"name": "a"}, "webhooks": [{"name": "w0", "x": 1}, {"name": "w1"}]}
    apply_json_patch(
        doc,
        [
            {"op": "replace", "path": "/metadata/name", "value": "b"},
            {"op": "add", "path": "/webhooks/1/objectSelector", "value": {"k": "v"}},
            {"op": "replace", "path": "/webhooks/0", "value": {"name": "w0b"}},
            {"op": "add", "path": "/webhooks/-", "value": {"name": "w2"}},
            {"op": "remove", "path": "/webhooks/2"},
        ],
    )
    assert doc == {
        "metadata": {"name": "b"},
        "webhooks": [{"name": "w0b"}, {"name": "w1", "objectSelector": {"k": "v"}}],
    }
    with pytest.raises(ValueError, match="/metadata/missing"):
        apply_json_patch(doc, [{"op": "replace", "path": "/metadata/missing", "value": 1}])
    with pytest.raises(ValueError, match="move"):
        apply_json_patch(doc, [{"op": "move", "path": "/metadata/name", "from": "/x"}])


def _peer_root() -> Path:
    # `make test-peer` builds them first; a missing build is an error here, never a skip
    return peer_tools_dir()


def _assert_loopback(docs: list[dict], url: str, ca: bytes) -> None:
    for doc in docs:
        for hook in doc["webhooks"]:
            cc = hook["clientConfig"]
            assert set(cc) == {"url", "caBundle"} and base64.b64decode(cc["caBundle"]) == ca
            assert cc["url"].startswith(url + "/")
            assert hook["failurePolicy"] == "Fail"


CA = b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"


def test_jobset_webhooks_point_at_loopback_with_the_ca_and_keep_the_release_patches(kube_tools):
    js = jobset.webhook_configurations("https://127.0.0.1:1", CA)
    pod_hooks = [h for d in js for h in d["webhooks"] if h["rules"][0]["resources"] == ["pods"]]
    # JobSet's release limits its pod webhooks to JobSet pods: other pods never reach them.
    assert len(pod_hooks) == 2
    assert all(h["objectSelector"]["matchExpressions"][0]["key"] == jobset.JOBSET_NAME_LABEL for h in pod_hooks)
    _assert_loopback(js, "https://127.0.0.1:1", CA)


@pytest.mark.peer
def test_trainer_webhooks_point_at_loopback_with_the_ca_and_keep_the_release_patches():
    tr = {d["metadata"]["name"]: d for d in trainer_webhook_configurations(_peer_root(), "https://127.0.0.1:2", CA)}
    assert set(tr) == {"defaulter.trainer.kubeflow.org", "validator.trainer.kubeflow.org"}
    _assert_loopback(list(tr.values()), "https://127.0.0.1:2", CA)


@pytest.mark.peer
@pytest.mark.slow
def test_cli_up_trainer_v2_admits_a_trainjob_through_its_webhooks_and_down_stops_it(own_clusters, tmp_path):
    """``up --chain --trainer-v2``: the controllers outlive the command, the release's torch runtime
    is installed, a TrainJob gets its JobSet, Job and a pod on a kwok node and completes; ``down``
    leaves no process."""
    import json
    import os
    import subprocess
    import sys

    import llmtrain
    from llmtrain_devcluster import DevCluster
    from llmtrain_devcluster.process import is_running, read_pids, wait_until

    _peer_root()
    state = tmp_path / "peer-cluster"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(llmtrain.__file__).resolve().parents[1]), env.get("PYTHONPATH")) if p
    )
    cli = [sys.executable, "-m", "llmtrain_devcluster"]
    recs: dict = {}
    try:
        up = subprocess.run(
            [*cli, "up", "--state-dir", str(state), "--chain", "--trainer-v2", "--nodes", "cpu=1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert up.returncode == 0, up.stderr[-3000:]
        recs = read_pids(state / "trainer-v2" / "pids.json")
        assert set(recs) == {"trainer-controller-manager"}
        assert is_running(read_pids(state / "pids.json")["jobset-controller"])  # the chain's
        assert all(is_running(r) for r in recs.values())
        cluster = DevCluster(state)
        # A TrainJob the validating webhook rejects proves the webhook is called and answers.
        bad = {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "bad"},
            "spec": {"runtimeRef": {"name": "no-such-runtime"}},
        }
        r = cluster.kubectl("create", "-n", "default", "-f", "-", input=json.dumps(bad), check=False)
        assert r.returncode != 0 and "validator.trainjob.trainer.kubeflow.org" in r.stderr, r.stderr
        good = {
            **bad,
            "metadata": {"name": "good"},
            "spec": {
                "runtimeRef": {"name": "torch-distributed"},
                "trainer": {"resourcesPerNode": {"requests": {"cpu": "1"}}},
            },
        }
        cluster.kubectl("create", "-n", "default", "-f", "-", input=json.dumps(good))
        # kwok runs the pod to completion (it has no llmtrain pod labels to keep it running): the
        # JobSet's Job completes, then the JobSet, then the TrainJob.
        wait_until(
            lambda: (
                cluster.kubectl(
                    "get",
                    "trainjob",
                    "good",
                    "-n",
                    "default",
                    "-o",
                    "jsonpath={.status.conditions[?(@.type=='Complete')].status}",
                ).stdout
                == "True"
            ),
            timeout=120,
            what="the TrainJob Complete",
        )
        pods = cluster.kubectl(
            "get",
            "pods",
            "-n",
            "default",
            "-l",
            "jobset.sigs.k8s.io/jobset-name=good",
            "-o",
            "jsonpath={.items[*].spec.nodeName}",
        ).stdout.split()
        assert pods == ["kwok-cpu-0"], pods
    finally:
        down = subprocess.run(
            [*cli, "down", "--state-dir", str(state)], env=env, capture_output=True, text=True, timeout=120
        )
    assert down.returncode == 0, down.stderr
    assert recs and not any(is_running(r) for r in recs.values())
    assert not (state / "trainer-v2" / "pids.json").exists()

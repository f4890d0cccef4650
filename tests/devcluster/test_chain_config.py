"""Chain-mode inputs that need no cluster: the --nodes option and kwok's config file."""

from __future__ import annotations

import argparse

import pytest
import yaml

from llmtrain.render import JOB_LABEL
from llmtrain_devcluster.__main__ import _nodes
from llmtrain_devcluster.chain import OWN_STAGE_FILES, STAGE_FILES, kwok_config, scoped_pod_complete
from llmtrain_devcluster.tools import kwok_stages_dir


def test_nodes_option_parses_catalog_types():
    assert _nodes("p5.48xlarge=4,p4de.24xlarge=1") == {"p5.48xlarge": 4, "p4de.24xlarge": 1}


@pytest.mark.parametrize("bad", ["p9.huge=2", "p5.48xlarge", "p5.48xlarge=two"])
def test_nodes_option_names_what_would_be_accepted(bad):
    with pytest.raises(argparse.ArgumentTypeError) as e:
        _nodes(bad)
    msg = str(e.value)
    assert bad.split(",")[0] in msg and "INSTANCE_TYPE=COUNT" in msg and "p5.48xlarge" in msg


def test_kwok_config_sets_every_worker_count_and_plays_the_modules_stages(kube_tools):
    docs = list(yaml.safe_load_all(kwok_config(kwok_stages_dir(), server_address="127.0.0.1:1")))
    opts = docs[0]["options"]
    # Read from a file, kwok applies no defaults to these: zero workers would play nothing.
    for key in (
        "nodeLeaseParallelism",
        "nodePlayStageParallelism",
        "podPlayStageParallelism",
        "podsOnNodeSyncParallelism",
        "nodeLeaseDurationSeconds",
    ):
        assert opts[key] > 0, key
    stages = [d for d in docs[1:] if d["kind"] == "Stage"]
    files = (*STAGE_FILES, *OWN_STAGE_FILES)
    assert {s["metadata"]["name"] for s in stages} == {f.rsplit("/", 1)[-1].removesuffix(".yaml") for f in files}


def test_kwoks_pod_complete_is_played_only_for_pods_without_the_training_label(kube_tools):
    docs = list(yaml.safe_load_all(kwok_config(kwok_stages_dir(), server_address="127.0.0.1:1")))
    (stage,) = [d for d in docs[1:] if d["metadata"]["name"] == "pod-complete"]
    shipped = yaml.safe_load((kwok_stages_dir() / "pod/fast/pod-complete.yaml").read_text())
    terms = stage["spec"]["selector"]["matchExpressions"]
    # kwok's own terms (Running, not deleting, owned by a Job) plus exactly one: no training label.
    assert terms[:-1] == shipped["spec"]["selector"]["matchExpressions"]
    assert terms[-1] == {"key": f'.metadata.labels["{JOB_LABEL}"]', "operator": "DoesNotExist"}
    assert stage["spec"]["next"] == shipped["spec"]["next"]
    with pytest.raises(ValueError, match="pod-complete"):
        scoped_pod_complete((kwok_stages_dir() / "pod/fast/pod-ready.yaml").read_text())

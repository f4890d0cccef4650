"""The real chain behind a PyTorchJob: kube-scheduler, kwok-simulated GPU nodes and the Kubeflow
training-operator, all pinned binaries from ``make tools`` (see :mod:`.tools`).

- **Nodes** are generated from the instance catalog (``operator/llmtrain/data/instances.yaml``
  through :mod:`llmtrain.catalog`): the instance-type label, the GPU and EFA taints the renderer
  tolerates, and capacity ``nvidia.com/gpu``, ``vpc.amazonaws.com/efa``, ``hugepages-2Mi``, cpu and
  memory at the catalog's numbers. kwok manages them (and their pods) by annotation.
- **kwok** runs with the stages shipped in its own module (``kustomize/stage``): node initialize
  and heartbeat (with a Lease), pod ready / complete / delete, and two chaos stages. Label a
  Running pod ``FAIL_POD_LABEL=true`` and kwok marks its container terminated (exit code from the
  ``.../exit-code`` annotation, default 1), pod Failed (``pod-container-running-failed``); label a
  node ``NOT_READY_NODE_LABEL=true`` and kwok reports it Ready=False, as a kubelet that lost its
  runtime or network does, until the label goes (``node-not-ready``; node-initialize then reports
  it Ready again). One stage is llmtrain's own (``stages/``): label a Running pod
  ``COMPLETE_POD_LABEL=true`` and its containers exit 0, pod Succeeded, as a finished training
  run's. kwok's own pod-complete completes a pod a batch Job owns right after it runs; here it is
  scoped (:func:`scoped_pod_complete`) to pods that are not training pods, i.e. lack
  ``llmtrain.dev/job``: a JobSet backend's pods are Job-owned and must run until the test (or the
  job's end) says otherwise, while a plain Job's or Trainer v2's own runtime's pods still complete.
- **training-operator** v1 runs only its PyTorchJob controller. It has no switch for its webhook
  server or cert rotator, so :mod:`.training_operator` creates what they wait for first.
- **JobSet** controller (:mod:`.jobset`), its webhooks served on loopback.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import yaml

__all__ = [
    "COMPLETE_POD_LABEL",
    "DEFAULT_NODES",
    "FAIL_EXIT_CODE_ANNOTATION",
    "FAIL_POD_LABEL",
    "FAIL_REASON_ANNOTATION",
    "KWOK_NODE_ANNOTATION",
    "NOT_READY_NODE_LABEL",
    "kwok_config",
    "node_manifest",
    "node_manifests",
    "scoped_pod_complete",
]

# kwok manages only Nodes carrying this annotation (kwok's own convention).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# kwok's chaos stage selects Running pods by this label; its annotations set exit code / reason.
FAIL_POD_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
FAIL_EXIT_CODE_ANNOTATION = f"{FAIL_POD_LABEL}/exit-code"
FAIL_REASON_ANNOTATION = f"{FAIL_POD_LABEL}/reason"
# kwok's chaos stage node-not-ready selects nodes by this label.
NOT_READY_NODE_LABEL = "node-not-ready.stage.kwok.x-k8s.io"
# llmtrain's own stage (stages/pod-container-running-completed.yaml) selects Running pods by this.
COMPLETE_POD_LABEL = "pod-container-running-completed.stage.llmtrain.dev"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# Pod IPs kwok hands out; must not overlap the cluster's service CIDR (10.0.0.0/24).
POD_CIDR = "10.244.0.0/16"
# Per node, like a kubelet's default max-pods.
MAX_PODS = 110

# What `DevCluster(chain=True)` registers: two p5s for a 2-node job, and one each of the
# shapes a p5 job must NOT land on (p4de: 4 EFA interfaces; p5en: 16).
DEFAULT_NODES: Mapping[str, int] = {"p5.48xlarge": 2, "p4de.24xlarge": 1, "p5en.48xlarge": 1}

# Stages from the kwok module (paths under kustomize/stage/, copied by install-tools.sh).
STAGE_FILES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
    "pod/chaos/pod-container-running-failed.yaml",
    "node/chaos/node-not-ready.yaml",
)
# kwok's pod-complete, played only for pods without the training label (scoped_pod_complete).
POD_COMPLETE = "pod/fast/pod-complete.yaml"
# llmtrain's own stages, beside this module.
OWN_STAGES_DIR = Path(__file__).parent / "stages"
OWN_STAGE_FILES = ("pod-container-running-completed.yaml",)


# EC2 instance topology as EKS labels it (topology.k8s.aws/network-node-layer-1..3, layer 3 the
# closest): here 4 nodes per layer-3 block, 4 blocks per layer 2, 4 of those per layer 1, counted
# per instance type by node index (kwok-p5-48xlarge-0..3 share a block).
TOPOLOGY_FANOUT = 4
TOPOLOGY_LABELS = tuple(f"topology.k8s.aws/network-node-layer-{i}" for i in (1, 2, 3))


def topology_labels(instance_type: str, index: int) -> dict[str, str]:
    kind = instance_type.split(".")[0]
    block = index // TOPOLOGY_FANOUT
    return {
        TOPOLOGY_LABELS[2]: f"nn-{kind}-l3-{block}",
        TOPOLOGY_LABELS[1]: f"nn-{kind}-l2-{block // TOPOLOGY_FANOUT}",
        TOPOLOGY_LABELS[0]: f"nn-{kind}-l1-{block // TOPOLOGY_FANOUT**2}",
    }


def node_name(instance_type: str, index: int) -> str:
    return f"kwok-{instance_type.replace('.', '-')}-{index}"


def node_manifest(instance_type: str, index: int) -> dict:
    """A kwok-managed Node shaped like one ``instance_type`` from the catalog."""
    from llmtrain.catalog import instance_type as lookup  # the one source of node shapes

    inst = lookup(instance_type)
    name = node_name(instance_type, index)
    capacity = {
        "cpu": str(inst.vcpus),
        "memory": f"{inst.memory_gib}Gi",
        "pods": str(MAX_PODS),
    }
    taints = []
    if inst.is_gpu:
        capacity["nvidia.com/gpu"] = str(inst.gpus_per_node)
        # The taints EKS GPU node groups carry; the renderer tolerates exactly these.
        taints.append({"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"})
    if inst.efa_interfaces:
        capacity["vpc.amazonaws.com/efa"] = str(inst.efa_interfaces)
        taints.append({"key": "vpc.amazonaws.com/efa", "value": "true", "effect": "NoSchedule"})
    if inst.hugepages_2mi:
        capacity["hugepages-2Mi"] = inst.hugepages_2mi
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                INSTANCE_TYPE_LABEL: inst.name,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/role": "agent",
                "type": "kwok",
                **topology_labels(instance_type, index),
            },
        },
        "spec": {"taints": taints},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def node_manifests(shapes: Mapping[str, int], start: Mapping[str, int] | None = None) -> list[dict]:
    """Nodes for ``{instance_type: count}``, numbered from ``start[instance_type]`` (default 0)."""
    start = start or {}
    return [node_manifest(t, start.get(t, 0) + i) for t, n in shapes.items() for i in range(n)]


def training_pod_label() -> str:
    """The label every llmtrain training pod carries, on either backend (the renderer's)."""
    from llmtrain.render import JOB_LABEL  # the one source of the pods' labels

    return JOB_LABEL


def scoped_pod_complete(stage_yaml: str) -> str:
    """kwok's pod-complete Stage with one more selector term: the pod lacks the training label.

    As shipped it completes every Running pod a batch Job owns at once. A JobSet's pods are Job
    owned, so it would end every llmtrain attempt on that backend (and the peer bench's Trainer v2
    pods, which run llmtrain's pod template) the moment it ran; llmtrain's own stage
    (``COMPLETE_POD_LABEL``) ends those when a test asks."""
    stage = yaml.safe_load(stage_yaml)
    if stage.get("kind") != "Stage" or stage["metadata"]["name"] != "pod-complete":
        raise ValueError(f"expected kwok's pod-complete Stage, got {stage.get('kind')} {stage.get('metadata')}")
    terms = stage["spec"]["selector"]["matchExpressions"]
    terms.append({"key": f'.metadata.labels["{training_pod_label()}"]', "operator": "DoesNotExist"})
    return yaml.safe_dump(stage, sort_keys=False)


def kwok_config(stages_dir: Path, *, server_address: str, parallelism: int = 4) -> str:
    """kwok's multi-document config: options plus the stages it plays.

    Options read from a file get no defaults for parallelism and leases (measured: without
    them nothing is played), so every one is set here.
    """
    options = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "cidr": POD_CIDR,
            "manageAllNodes": False,
            "manageNodesWithAnnotationSelector": f"{KWOK_NODE_ANNOTATION}=fake",
            "serverAddress": server_address,
            "nodeLeaseDurationSeconds": 40,
            "nodeLeaseParallelism": parallelism,
            "nodePlayStageParallelism": parallelism,
            "podPlayStageParallelism": parallelism,
            "podsOnNodeSyncParallelism": parallelism,
            "enablePodsOnNodeSyncListPager": True,
            # A stream watch is a WatchList (sendInitialEvents), which the API server has off.
            "enablePodsOnNodeSyncStreamWatch": False,
        },
    }
    docs = [yaml.safe_dump(options, sort_keys=False)]
    files = [(Path(stages_dir), rel) for rel in STAGE_FILES] + [(OWN_STAGES_DIR, rel) for rel in OWN_STAGE_FILES]
    for where, rel in files:
        text = (where / rel).read_text()
        if "kind: Stage" not in text:
            raise ValueError(f"{rel} in {where} is not a kwok Stage")
        if rel == POD_COMPLETE:
            text = scoped_pod_complete(text)
        docs.append(text.strip() + "\n")
    return "---\n".join(docs)

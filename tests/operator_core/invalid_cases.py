"""Invalid LLMTrainingJobs that the CRD schema accepts but validation must reject.

Shared by the offline validation tests and the cluster tests (where the operator must mark each one
Failed with the same message and carry on). Each case: (id, name, spec overrides, field, fragment).
"""

import copy

BASE = {
    "model": {"preset": "llama2-7b"},
    "data": {"uri": "s3://bucket/tokens/", "seqLen": 4096},
    "cluster": {"instanceType": "p5.48xlarge", "nodes": 2},
    "training": {"maxSteps": 100, "globalBatchTokens": 4096 * 16 * 4, "warmupSteps": 10},
    "checkpoint": {"uri": "s3://bucket/ckpt/"},
}


def spec_with(overrides: dict) -> dict:
    spec = copy.deepcopy(BASE)
    for section, values in overrides.items():
        if values is None:
            spec.pop(section, None)
        elif section == "model":
            spec[section] = values  # replace: preset/dims are alternatives
        else:
            spec.setdefault(section, {}).update(values)
    return spec


CASES = [
    (
        "hybrid-one-node",
        "bad-hybrid",
        {
            "cluster": {"nodes": 1},
            "fsdp": {"shardingStrategy": "HYBRID_SHARD"},
            "training": {"globalBatchTokens": 4096 * 8 * 4},
        },
        "spec.fsdp.shardingStrategy",
        "at least 2 nodes",
    ),
    (
        "does-not-fit",
        "bad-fit",
        {
            "model": {"preset": "llama2-70b"},
            "cluster": {"instanceType": "p4d.24xlarge", "nodes": 1},
            "training": {"globalBatchTokens": 4096 * 8 * 4},
        },
        "spec.cluster",
        "GiB per device",
    ),
    ("data-uri-scheme", "bad-data-uri", {"data": {"uri": "gs://bucket/tokens/"}}, "spec.data.uri", "unsupported URI"),
    (
        "checkpoint-uri-scheme",
        "bad-ckpt-uri",
        {"checkpoint": {"uri": "hdfs://nn/ckpt"}},
        "spec.checkpoint.uri",
        "unsupported URI",
    ),
    (
        "pretrained-uri-scheme",
        "bad-weights-uri",
        {"model": {"preset": "llama2-7b", "pretrainedUri": "https://example.com/model"}},
        "spec.model.pretrainedUri",
        "unsupported URI",
    ),
    (
        "preset-and-dims",
        "bad-model-both",
        {
            "model": {
                "preset": "llama2-7b",
                "dims": {
                    "hiddenSize": 64,
                    "intermediateSize": 128,
                    "numLayers": 2,
                    "numHeads": 4,
                    "numKvHeads": 4,
                    "vocabSize": 256,
                },
            }
        },
        "spec.model",
        "exactly one of preset and dims",
    ),
    ("no-model", "bad-model-none", {"model": {}}, "spec.model", "exactly one of preset and dims"),
    (
        "heads-divide-hidden",
        "bad-heads",
        {
            "model": {
                "dims": {
                    "hiddenSize": 100,
                    "intermediateSize": 256,
                    "numLayers": 2,
                    "numHeads": 3,
                    "numKvHeads": 3,
                    "vocabSize": 256,
                }
            }
        },
        "spec.model.dims.numHeads",
        "not divisible",
    ),
    (
        "gqa-groups",
        "bad-gqa",
        {
            "model": {
                "dims": {
                    "hiddenSize": 128,
                    "intermediateSize": 256,
                    "numLayers": 2,
                    "numHeads": 8,
                    "numKvHeads": 3,
                    "vocabSize": 256,
                }
            }
        },
        "spec.model.dims.numKvHeads",
        "not a multiple",
    ),
    (
        "batch-arithmetic",
        "bad-batch",
        {"training": {"globalBatchTokens": 1000}},
        "spec.training.globalBatchTokens",
        "not a multiple of seqLen",
    ),
    (
        "warmup-too-long",
        "bad-warmup",
        {"training": {"warmupSteps": 100}},
        "spec.training.warmupSteps",
        "not below maxSteps",
    ),
    (
        "min-lr-above-lr",
        "bad-min-lr",
        {"training": {"learningRate": 1e-4, "minLearningRate": 1e-3}},
        "spec.training.minLearningRate",
        "exceeds learningRate",
    ),
    (
        "min-nodes-above-nodes",
        "bad-min-nodes",
        {"cluster": {"minNodes": 3}},
        "spec.cluster.minNodes",
        "more than nodes",
    ),
    (
        "processes-on-gpu",
        "bad-procs",
        {"cluster": {"processesPerNode": 4}},
        "spec.cluster.processesPerNode",
        "one worker per GPU",
    ),
    (
        "reserved-env",
        "bad-env",
        {"cluster": {"env": {"MASTER_ADDR": "10.0.0.1"}}},
        "spec.cluster.env.MASTER_ADDR",
        "set by torchrun",
    ),
    (
        "file-uri-without-volume",
        "bad-fsx",
        {"data": {"uri": "file:///fsx/tokens/"}},
        "spec.data.uri",
        "not under any volume",
    ),
    (
        "duplicate-mounts",
        "bad-mounts",
        {
            "cluster": {
                "volumes": [
                    {"name": "a", "claimName": "a", "mountPath": "/data"},
                    {"name": "b", "claimName": "b", "mountPath": "/data/"},
                ]
            }
        },
        "spec.cluster.volumes[].mountPath",
        "duplicated",
    ),
    (
        "seq-beyond-context",
        "bad-seq",
        {"data": {"seqLen": 8192}, "training": {"globalBatchTokens": 8192 * 16 * 4}},
        "spec.data.seqLen",
        "context length",
    ),
    (
        "fp16-on-cpu",
        "bad-fp16",
        {
            "model": {"preset": "tiny"},
            "data": {"seqLen": 128},
            "cluster": {"instanceType": "cpu", "nodes": 1},
            "fsdp": {"mixedPrecision": "fp16"},
            "training": {"globalBatchTokens": 128 * 2 * 4},
        },
        "spec.fsdp.mixedPrecision",
        "not supported on CPU",
    ),
    (
        "toleration-equal-without-value",
        "bad-toleration",
        {"cluster": {"tolerations": [{"key": "dedicated", "operator": "Equal"}]}},
        "spec.cluster.tolerations[0]",
        "needs a key and a value",
    ),
    ("name-too-long", "x" * 46, {}, "metadata.name", "DNS-1035"),
    (
        "priority-without-queue",
        "bad-priority",
        {"cluster": {"workloadPriorityClass": "production"}},
        "spec.cluster.workloadPriorityClass",
        "only manages a job with a queue",
    ),
    (
        "topology-without-queue",
        "bad-topology",
        {"cluster": {"topology": {"mode": "required", "level": "topology.k8s.aws/network-node-layer-3"}}},
        "spec.cluster.topology",
        "only manages a job with a queue",
    ),
]

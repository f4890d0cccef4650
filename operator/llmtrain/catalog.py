"""The instance catalog and the model presets, loaded from the package's data files.

`data/instances.yaml` and `data/models.yaml` are the single source of truth: validation, the
planner, the renderer, the trainer's MFU, the dashboards and terraform all read them. This module
only turns them into typed, immutable records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

import yaml

GIB = 1024**3


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpu: str
    gpus_per_node: int
    gpu_memory_gib: float
    peak_flops_per_device: float
    efa_interfaces: int
    network_gbps: int
    vcpus: int
    memory_gib: int
    family: str
    nccl_env: Mapping[str, str] = field(default_factory=dict)
    hugepages_2mi: str | None = None
    processes_per_node: int | None = None
    allreduce_busbw_gbps: float | None = None  # expected all-reduce bus bandwidth, GB/s (preflight)

    @property
    def is_gpu(self) -> bool:
        return self.gpus_per_node > 0

    @property
    def devices_per_node(self) -> int:
        """Worker processes per node: one per GPU, or the CPU default for `cpu`."""
        return self.gpus_per_node if self.is_gpu else (self.processes_per_node or 1)

    def workers_per_node(self, requested: int | None = None) -> int:
        """Worker processes per node for a job: one per GPU on GPU types; on `cpu`, the job's
        spec.cluster.processesPerNode when given (validation rejects it on GPU types)."""
        return self.gpus_per_node if self.is_gpu else (requested or self.devices_per_node)

    @property
    def device_memory_bytes(self) -> int:
        return int(self.gpu_memory_gib * GIB)


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1-style RoPE frequency scaling (Hugging Face `rope_scaling` with rope_type "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"


@dataclass(frozen=True)
class ModelDims:
    """Llama-architecture dimensions. `head_dim` = hidden_size / num_heads."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    max_seq_len: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    rope_scaling: RopeScaling | None = None

    def __post_init__(self):
        if isinstance(self.rope_scaling, dict):  # from models.yaml or a spec's dims
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def _load(name: str) -> dict:
    text = resources.files("llmtrain").joinpath("data", name).read_text()
    return yaml.safe_load(text)


@cache
def instance_types() -> dict[str, InstanceType]:
    raw = _load("instances.yaml")
    families = raw["families"]
    out = {}
    for name, entry in raw["instances"].items():
        fam = families[entry["family"]]
        entry = {**entry, "peak_flops_per_device": float(entry["peak_flops_per_device"])}
        out[name] = InstanceType(
            name=name,
            nccl_env=dict(fam.get("nccl_env") or {}),
            hugepages_2mi=fam.get("hugepages_2mi"),
            **entry,
        )
    return out


@cache
def model_presets() -> dict[str, ModelDims]:
    return {name: ModelDims(**dims) for name, dims in _load("models.yaml")["presets"].items()}


def instance_type(name: str) -> InstanceType:
    types = instance_types()
    if name not in types:
        raise KeyError(f"unknown instance type {name!r}; known: {', '.join(types)}")
    return types[name]


def model_preset(name: str) -> ModelDims:
    presets = model_presets()
    if name not in presets:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(presets)}")
    return presets[name]

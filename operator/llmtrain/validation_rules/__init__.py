"""The semantic rules of an LLMTrainingJob, as a table: what the CRD schema cannot express.

Each rule is a small function over one `Subject` (the typed, resolved spec and what it is checked
against) that yields a `Problem` per thing it finds wrong: the field, why, and what would be
accepted. `RULES` lists them in the order their problems are reported; `run` tries every one and
returns every problem, not just the first. The `rule` mark records the fields a rule names, the
rules whose passing it needs (`needs`: the memory fit is only computed for a well-formed model), and
whether a problem ends the check (`stop`: an unknown instance type has no catalog entry to check
the rest against). The reference page docs/reference/validation.md is generated from the table
(scripts/gen-docs.py): the docstring's first line says what a rule checks, the rest why.

A new rule is a function in the module of its part of the spec and a row in RULES, with its cases
(a good spec, a bad one and the exact message) in tests/operator_core/test_validation_table.py.
validation.py parses the spec and runs the table.

The parts: `base` (the table's types), `admission`, `model`, `cluster`, `training`, `resilience`.
"""

from __future__ import annotations

from .admission import (
    allowed_image_registry,
    allowed_service_account,
    enabled_backend,
    job_name,
    known_backend,
)
from .base import Problem, Rule, Subject, rule, shorten
from .cluster import (
    ENV_NAME_RE,
    LOADER_ENV,
    LOADER_ENV_PREFIXES,
    RESERVED_ENV,
    RESERVED_ENV_PREFIXES,
    env_names,
    file_uris_on_shared_volumes,
    known_instance_type,
    kueue_fields_need_a_queue,
    min_nodes,
    no_volume_at_dev_shm,
    node_selector_keys,
    processes_per_node_on_cpu_only,
    toleration_operators,
    topology_level,
    unique_mount_paths,
    unique_volume_names,
)
from .model import (
    DATA_SCHEMES,
    MODEL_RULES,
    STORAGE_SCHEMES,
    even_head_dim,
    heads_divide_hidden,
    known_preset,
    kv_heads_divide_heads,
    preset_or_dims,
    uri_schemes,
)
from .resilience import (
    endpoint_port,
    etcd_endpoint,
    memory_snapshots_need_checkpoints,
    straggler_replace_needs_checkpoints,
)
from .training import (
    FLOAT8_GPUS,
    batch_of_whole_micro_steps,
    fits_in_memory,
    float8_needs_float8_gpus,
    fp16_on_gpus_only,
    hybrid_shard_needs_nodes,
    min_lr_within_lr,
    seq_len_within_context,
    snapshots_fit_in_host_memory,
    supports_float8,
    warmup_below_max_steps,
)

RULES: tuple[Rule, ...] = (
    allowed_image_registry,
    allowed_service_account,
    known_backend,
    enabled_backend,
    job_name,
    *MODEL_RULES,
    uri_schemes,
    known_instance_type,
    min_nodes,
    kueue_fields_need_a_queue,
    topology_level,
    processes_per_node_on_cpu_only,
    env_names,
    node_selector_keys,
    unique_volume_names,
    unique_mount_paths,
    no_volume_at_dev_shm,
    toleration_operators,
    file_uris_on_shared_volumes,
    hybrid_shard_needs_nodes,
    float8_needs_float8_gpus,
    fp16_on_gpus_only,
    warmup_below_max_steps,
    min_lr_within_lr,
    batch_of_whole_micro_steps,
    seq_len_within_context,
    fits_in_memory,
    snapshots_fit_in_host_memory,
    straggler_replace_needs_checkpoints,
    memory_snapshots_need_checkpoints,
    endpoint_port,
    etcd_endpoint,
)


def run(j: Subject) -> list[Problem]:
    """Every problem the table finds, in its order."""
    found: list[Problem] = []
    passed: set[Rule] = set()
    for r in RULES:
        if not all(n in passed for n in r.needs):
            continue
        problems = r(j)
        found += problems
        if not problems:
            passed.add(r)
        elif r.stop:
            break
    return found


__all__ = [
    "DATA_SCHEMES",
    "ENV_NAME_RE",
    "FLOAT8_GPUS",
    "LOADER_ENV",
    "LOADER_ENV_PREFIXES",
    "MODEL_RULES",
    "RESERVED_ENV",
    "RESERVED_ENV_PREFIXES",
    "RULES",
    "STORAGE_SCHEMES",
    "Problem",
    "Rule",
    "Subject",
    "allowed_image_registry",
    "allowed_service_account",
    "batch_of_whole_micro_steps",
    "enabled_backend",
    "endpoint_port",
    "env_names",
    "etcd_endpoint",
    "even_head_dim",
    "file_uris_on_shared_volumes",
    "fits_in_memory",
    "float8_needs_float8_gpus",
    "fp16_on_gpus_only",
    "heads_divide_hidden",
    "hybrid_shard_needs_nodes",
    "job_name",
    "known_backend",
    "known_instance_type",
    "known_preset",
    "kueue_fields_need_a_queue",
    "kv_heads_divide_heads",
    "memory_snapshots_need_checkpoints",
    "min_lr_within_lr",
    "min_nodes",
    "no_volume_at_dev_shm",
    "node_selector_keys",
    "preset_or_dims",
    "processes_per_node_on_cpu_only",
    "rule",
    "run",
    "seq_len_within_context",
    "shorten",
    "snapshots_fit_in_host_memory",
    "straggler_replace_needs_checkpoints",
    "supports_float8",
    "toleration_operators",
    "topology_level",
    "unique_mount_paths",
    "unique_volume_names",
    "uri_schemes",
    "warmup_below_max_steps",
]

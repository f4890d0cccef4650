"""The instance catalog and presets against published figures (datasheets, papers), not against
the code's own output."""

import pytest

from llmtrain.catalog import instance_type, instance_types, model_preset, model_presets
from llmtrain.flops import num_params

# EFA interfaces per instance (AWS instance docs, design.md §4) and dense BF16 peak (NVIDIA).
PUBLISHED = {
    "p4d.24xlarge": (4, 312e12, 40),
    "p4de.24xlarge": (4, 312e12, 80),
    "p5.48xlarge": (32, 989e12, 80),
    "p5e.48xlarge": (32, 989e12, 141),
    "p5en.48xlarge": (16, 989e12, 141),
}
# Published parameter counts (Llama 2 paper; Llama 3 model card).
PUBLISHED_PARAMS = {
    "llama2-7b": 6.74e9,
    "llama2-13b": 13.0e9,
    "llama2-70b": 69.0e9,
    "llama3-8b": 8.03e9,
    "llama3-70b": 70.6e9,
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_gpu_instances_match_published_figures(name):
    efa, peak, mem = PUBLISHED[name]
    inst = instance_type(name)
    assert (inst.efa_interfaces, inst.peak_flops_per_device, inst.gpu_memory_gib) == (efa, peak, mem)
    assert inst.gpus_per_node == 8 and inst.devices_per_node == 8
    assert inst.nccl_env["FI_PROVIDER"] == "efa"  # or NCCL silently falls back to TCP sockets


def test_p4_family_enables_gpudirect_rdma_and_p5_leaves_it_to_the_installer():
    assert instance_type("p4de.24xlarge").nccl_env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert "FI_EFA_USE_DEVICE_RDMA" not in instance_type("p5.48xlarge").nccl_env


def test_cpu_entry_is_for_local_runs():
    cpu = instance_type("cpu")
    assert not cpu.is_gpu and cpu.efa_interfaces == 0 and cpu.devices_per_node >= 1
    assert cpu.nccl_env == {}


def test_catalog_has_exactly_the_documented_types():
    assert set(instance_types()) == set(PUBLISHED) | {"cpu"}


@pytest.mark.parametrize("preset", PUBLISHED_PARAMS)
def test_presets_have_published_parameter_counts(preset):
    assert num_params(model_preset(preset)) == pytest.approx(PUBLISHED_PARAMS[preset], rel=0.01)


def test_presets_are_consistent_llama_shapes():
    for name, d in model_presets().items():
        assert d.hidden_size % d.num_heads == 0, name
        assert d.num_heads % d.num_kv_heads == 0, name
        assert d.head_dim % 2 == 0, name


def test_unknown_names_say_what_exists():
    with pytest.raises(KeyError, match=r"p5.48xlarge"):
        instance_type("p9.huge")
    with pytest.raises(KeyError, match="llama3-8b"):
        model_preset("llama9")

"""A torchx component for the llmtrain trainer: any torchx scheduler launches the same workers the
operator's PyTorchJob runs, from an LLMTrainingJob file.

    torchx run -s local_cwd trainer/llmtrain_trainer/cli/torchx_component.py:llmtrain \\
        --job_file examples/tiny-cpu.yaml
    torchx run -s local_cwd llmtrain.llmtrain --job_file examples/tiny-cpu.yaml   # installed entry point

The job file is validated exactly as `llmtrain validate` does (derived defaults resolved), then
turned into torchx's `dist.torchrun` AppDef: `torchrun -m llmtrain_trainer` on `nodes` replicas of
`workers per node` processes (one per GPU; spec.cluster.processesPerNode on cpu), c10d rendezvous,
no torchrun restarts (restarts belong to whoever resubmits, as with the operator), the instance
type's GPU/EFA/CPU/memory from the catalog, and the same environment the renderer gives the pods
(NCCL/libfabric preset, LLMTRAIN_SPEC with the whole resolved spec, spec.cluster.env last).
"""

# No `from __future__ import annotations`: torchx reads the component's argument types from the
# real annotations to parse command-line values.
import torchx.specs as specs
from torchx.components.dist import torchrun

from llmtrain.catalog import instance_type
from llmtrain.pod_contract import METRICS_PORT, METRICS_PORT_ENV, worker_env
from llmtrain.validation import load_job


def llmtrain(
    job_file: str, attempt: int = 1, metrics_port: int = METRICS_PORT, rdzv_port: int = 29500, name: str = ""
) -> specs.AppDef:
    """Run an LLMTrainingJob's trainer.

    Args:
        job_file: LLMTrainingJob YAML file (validated like `llmtrain validate`)
        attempt: attempt number (names the run; the trainer resumes from the newest checkpoint)
        metrics_port: first Prometheus port of each node's ranks (port + local rank)
        rdzv_port: c10d rendezvous port on the first node
        name: app name (default: the job's metadata.name)
    """
    job = load_job(job_file)
    spec = job.spec
    inst = instance_type(spec.cluster.instance_type)
    procs = inst.workers_per_node(spec.cluster.processes_per_node)
    env = {e["name"]: e["value"] for e in worker_env(spec, inst, job.name, job.namespace, attempt) if "value" in e}
    env[METRICS_PORT_ENV] = str(metrics_port)
    nodes = spec.cluster.nodes
    min_nodes = spec.cluster.min_nodes or nodes
    app = torchrun(
        m="llmtrain_trainer",
        name=name or job.name,
        image=spec.cluster.image,
        j=f"{min_nodes}:{nodes}x{procs}" if min_nodes != nodes else f"{nodes}x{procs}",
        cpu=max(1, inst.vcpus * 85 // 100) if inst.is_gpu else procs,
        gpu=inst.gpus_per_node,
        memMB=(inst.memory_gib * 1024 * 85 // 100) if inst.is_gpu else 4096 * procs,
        env=env,
        max_retries=0,
        rdzv_port=rdzv_port,
    )
    if inst.efa_interfaces:  # every EFA interface of the node, as the renderer requests
        for role in app.roles:
            role.resource.devices["vpc.amazonaws.com/efa"] = inst.efa_interfaces
    return app

"""Pod created → first training step on the dev cluster's real node: a kubelet, containerd and runc
running the trainer image built from the Dockerfile (make trainer-image), beside the simulated
figures of docs/performance/recovery.md, where kwok's pods start the instant they are bound.

The job is the demo's: the tiny preset as a PyTorchJob of two pods with one rank each, c10d
rendezvous through the training-operator's headless Service, checkpoints on a local
PersistentVolume. The bench renders it with llmtrain's renderer and creates the child itself (the
operator's part of a start is measured in recovery.md). Per run, rank 0's pod, on one clock
(time.monotonic; the trainer's step times are converted from the wall clock, same machine):

    container start         pod created → its container running (sandbox, CNI, runc, the image
                            check), both as the bench's pod watch sees them
    process + rendezvous    → rank 0's `config` line, as `kubectl logs -f` delivers it (python and
                            torch imported, torchrun's rendezvous, the process group); the stream's
                            delay counts here and is taken from the next phase
    model build             → the training loop's start (the first step's end minus its own time),
                            less the checkpoint load
    checkpoint load         the `resume` event's own seconds (resumed runs only)
    first step              the first step's own time

and the image: the trainer image's import into the node's containerd (no registry) when the node's
slot lacks it (once per slot, reported as measured, or as "already there"); the kubelet then only
checks that it is present. Two kinds of run, alternated: fresh (no checkpoint) and resumed (the same
job's next attempt, loading the checkpoint the fresh one left at its last step).

    .venv/bin/python bench/real_pod_startup.py [--repeats 3] [--json bench/results/real_pod_startup.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from llmtrain_devcluster import DevCluster
from llmtrain_devcluster.node import import_image, job_on_the_node, local_volume
from llmtrain_devcluster.tools import find_tool
from trainer_events import TrainerEvents

REPO = Path(__file__).resolve().parents[1]
VOLUME = {"name": "ckpt", "claimName": "ckpt", "mountPath": "/ckpt"}
CACHE = Path(os.environ.get("LLMTRAIN_CACHE") or Path.home() / ".cache" / "llmtrain")
NS = "bench"
STEPS = 20  # the fresh run's; its resumed attempt trains STEPS more from the checkpoint at STEPS


def job(name: str, image: str, steps: int) -> dict:
    """examples/tiny-cpu.yaml (the demo's job) as two pods of one rank each on the real node, its
    checkpoints on the volume, one at its last step."""
    doc = job_on_the_node(yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text()), image)
    doc["metadata"] = {"name": name, "namespace": NS}
    doc["spec"]["cluster"].update(nodes=2, processesPerNode=1, volumes=[VOLUME])
    doc["spec"]["training"]["maxSteps"] = steps
    doc["spec"]["checkpoint"] = {"uri": f"file:///ckpt/{name}/", "intervalSteps": steps}
    return doc


def render(doc: dict, attempt: int, tmp: Path) -> str:
    path = tmp / f"{doc['metadata']['name']}-{attempt}.yaml"
    path.write_text(yaml.safe_dump(doc))
    cmd = [sys.executable, "-m", "llmtrain.cli", "render", str(path), "--namespace", NS, "--attempt", str(attempt)]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


class PodClock:
    """Watch-observed times of one pod's creation and its container running (kubectl get -w)."""

    def __init__(self, cluster: DevCluster, pod: str):
        self.created: float | None = None
        self.running: float | None = None
        cmd = [str(find_tool("kubectl")), "--kubeconfig", str(cluster.kubeconfig), "get", "pods", "-n", NS]
        cmd += ["--field-selector", f"metadata.name={pod}", "-w", "--output-watch-events", "-o", "json"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        buf = ""
        for line in self.proc.stdout:
            buf += line
            try:
                ev = json.loads(buf)
            except ValueError:
                continue
            buf, now = "", time.monotonic()
            if self.created is None:
                self.created = now
            states = [c.get("state") or {} for c in ev["object"].get("status", {}).get("containerStatuses") or []]
            if self.running is None and states and all("running" in s for s in states):
                self.running = now

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def one_run(cluster: DevCluster, doc: dict, attempt: int, tmp: Path) -> dict:
    name = doc["metadata"]["name"]
    rank0 = f"{name}-a{attempt}-worker-0"
    clock = PodClock(cluster, rank0)  # watching before the child exists: its ADDED is the creation
    time.sleep(1.0)  # the watch's list (empty) is done by then; what follows is the pod's ADDED
    cluster.kubectl("apply", "-f", "-", input=render(doc, attempt, tmp))
    deadline = time.monotonic() + 300
    while clock.running is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{rank0} not running after 300 s")
        time.sleep(0.02)
    logs = TrainerEvents(
        [str(find_tool("kubectl")), "--kubeconfig", str(cluster.kubeconfig), "logs", "-f", "-n", NS, rank0],
        dict(os.environ),
        tmp / f"{rank0}.log",
    )
    t_config, _ = logs.next_event(lambda e: e.get("event") == "config") or (None, None)
    resume = None
    if attempt > 1:
        resume = logs.next_event(lambda e: e.get("event") == "resume")[1]
    t_step, step = logs.next_event(lambda e: e.get("event") == "step") or (None, None)
    if t_config is None or step is None:
        raise RuntimeError(f"{rank0} ended before its first step; see {logs.log.name}")
    logs.next_event(lambda e: e.get("event") == "end", timeout=300)
    clock.stop()
    # the step's end on the monotonic clock (the trainer stamps it with the wall clock)
    step_end = step["time"] - (time.time() - time.monotonic())
    loop_start = step_end - step["step_seconds"]
    load = resume["seconds"] if resume else 0.0
    assert clock.created is not None
    out = {
        "attempt": attempt,
        "resumed_from": resume["step"] if resume else None,
        "container_start_s": clock.running - clock.created,
        "process_and_rendezvous_s": t_config - clock.running,
        "model_build_s": loop_start - t_config - load,
        "checkpoint_load_s": load,
        "first_step_s": step["step_seconds"],
        "total_s": step_end - clock.created,
        "log_arrival_lag_s": t_step - step_end,
    }
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args()
    manifest = json.loads((CACHE / "trainer-image" / "current.json").read_text())
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="real-pod-startup-") as t:
        tmp = Path(t)
        with DevCluster(tmp / "cluster", chain=True, nodes={}, real_node=True) as cluster:
            t0 = time.monotonic()
            imported = import_image(cluster, manifest["archive_path"])
            image = {"ref": manifest["ref"], "imported": imported, "seconds": round(time.monotonic() - t0, 1)}
            cluster.kubectl("create", "namespace", NS)
            local_volume(cluster, NS, "ckpt", tmp / "ckpt")
            runs: dict[str, list[dict]] = {"fresh": [], "resumed": []}
            for r in range(a.repeats):
                doc = job(f"start-{r}", manifest["ref"], STEPS)
                runs["fresh"].append(one_run(cluster, doc, 1, tmp))
                doc["spec"]["training"]["maxSteps"] = 2 * STEPS
                runs["resumed"].append(one_run(cluster, doc, 2, tmp))
                assert runs["resumed"][-1]["resumed_from"] == STEPS, runs["resumed"][-1]
                print(json.dumps({"repeat": r, "fresh": runs["fresh"][-1], "resumed": runs["resumed"][-1]}))
    phases = [k for k in runs["fresh"][0] if k.endswith("_s")]
    median = {kind: {k: round(statistics.median(x[k] for x in rs), 3) for k in phases} for kind, rs in runs.items()}
    result = {
        "bench": "real_pod_startup",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores",
        "load_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "image": image,
        "median": median,
        "runs": runs,
    }
    for kind, m in median.items():
        print(
            f"{kind}: pod created → first step {m['total_s']:.2f} s (median of {a.repeats}): container start "
            f"{m['container_start_s']:.2f}, process + rendezvous {m['process_and_rendezvous_s']:.2f}, model build "
            f"{m['model_build_s']:.2f}, checkpoint load {m['checkpoint_load_s']:.2f}, "
            f"first step {m['first_step_s']:.2f}"
        )
    how = f"imported in {image['seconds']} s" if imported else "already in the node's slot"
    print(f"image: {image['ref']} {how}")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

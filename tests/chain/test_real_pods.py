"""The trainer image on the dev cluster's real node: what llmtrain renders, run by a real kubelet
(issue 42, items 4 to 6). One chain cluster for the module, with its real node and no kwok node,
the image make trainer-image built (imported into the node), an operator watching this module's
namespace, which enforces Pod Security "restricted".

- Bad input on a real pod: an image the node does not hold (ErrImageNeverPull: the status and a
  Warning event name the image, no restart spent), a checkpoint path on a read-only volume (the
  trainer's error names the path; no restart loop with maxRestarts 0).
- The pod's securityContext as the kubelet enforces it: the trainer runs as the rendered UID with
  no capability, and /dev/shm and the staging volume are writable.
- A worker process killed inside its pod (spec.checkpoint.memory on): torchrun restarts the workers
  in place and they resume from their snapshots in the pods' memory-backed /dev/shm, not from step 0.
- SIGTERM: a pod deleted mid-run gets the kubelet's SIGTERM, the trainer commits a checkpoint within
  the grace period, and the next attempt resumes from exactly that step, on both backends.

The checkpoints live on a local PersistentVolume (a directory of this test bound into the pods by
the kubelet), the way a cluster's FSx or EBS volume is mounted (spec.cluster.volumes).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from backend_child import OPERATOR_ARGS, attempt_pods, on
from llmtrain.spec import GROUP, PLURAL, VERSION
from llmtrain_devcluster import DevCluster
from llmtrain_devcluster.node import import_image, job_on_the_node, local_volume
from llmtrain_devcluster.process import wait_until
from operator_core.conftest import OperatorProcess
from plugins.needs import needs

pytestmark = [pytest.mark.slow, pytest.mark.trainer]

CACHE = Path(os.environ.get("LLMTRAIN_CACHE") or Path.home() / ".cache" / "llmtrain")
REPO = Path(__file__).resolve().parents[2]
MANIFEST = CACHE / "trainer-image" / "current.json"  # scripts/trainer-image.sh (make test builds it)
UID = 65532  # the rendered runAsUser (render.py), the image's own user
# SIGKILL the pod's trainer worker (a process torchrun started: LOCAL_RANK in its environment), as a
# crash would; prints its pid
KILL_WORKER = """
import os, signal
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\\0")
    except OSError:
        continue
    if any(v.startswith(b"LOCAL_RANK=") for v in env):
        os.kill(int(pid), signal.SIGKILL)
        print(pid)
"""


def _wait(fn, what: str, timeout: float = 120.0):
    return wait_until(fn, timeout=timeout, what=what, on_fail=AssertionError)


@pytest.fixture(scope="module")
@needs("cluster")
def real(tmp_path_factory):
    try:
        image = json.loads(MANIFEST.read_text())
    except (OSError, ValueError) as e:
        raise AssertionError(f"no trainer image ({MANIFEST}: {e}): make test builds it (make trainer-image)") from e
    tmp = tmp_path_factory.mktemp("real-pods")
    with DevCluster(tmp / "cluster", chain=True, nodes={}, real_node=True) as cluster:
        import_image(cluster, image["archive_path"])
        ns = f"rp-{uuid.uuid4().hex[:8]}"
        with cluster.api_client() as api:
            core = client.CoreV1Api(api)
            core.create_namespace(
                {"metadata": {"name": ns, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
            )
            op = OperatorProcess(
                cluster.kubeconfig, tmp / "operator.log", 9410, extra_args=["--namespace", ns, *OPERATOR_ARGS]
            )
            op.start()
            try:
                yield Real(cluster, api, ns, image["ref"], tmp)
            finally:
                op.stop()


@pytest.fixture
def rp(real):
    """The module's cluster for one test; its jobs are deleted afterwards and their pods gone (the
    node has 2 CPUs: one job's two pods take them all)."""
    yield real
    for name in real.created:
        real.custom.delete_namespaced_custom_object(GROUP, VERSION, real.ns, PLURAL, name)
    real.created.clear()
    _wait(lambda: not real.core.list_namespaced_pod(real.ns).items, "the test's pods gone", 120)


class Real:
    def __init__(self, cluster: DevCluster, api, ns: str, image: str, tmp: Path):
        self.cluster, self.ns, self.image, self.tmp = cluster, ns, image, tmp
        self.created: list[str] = []
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def job(self, name: str, *, steps: int = 40, volumes=(), checkpoint: str | None = None, **cluster) -> dict:
        """examples/tiny-cpu.yaml (the demo's job) as two real pods of one rank each, on the image
        under test, no restart unless a test allows one."""
        doc = job_on_the_node(yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text()), self.image)
        doc["metadata"] = {"name": name}
        doc["spec"]["cluster"].update(nodes=2, processesPerNode=1, volumes=list(volumes), **cluster)
        doc["spec"]["training"]["maxSteps"] = steps
        doc["spec"]["checkpoint"] = {"uri": checkpoint or f"file:///tmp/{name}/", "intervalSteps": 10_000}
        # no restart, in place (torchrun's rounds: ~20 s each on a loaded 2-core machine) or not
        doc["spec"]["resilience"] = {"maxRestarts": 0, "inPlaceRestarts": 0}
        return doc

    def apply(self, doc: dict) -> str:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, doc)
        self.created.append(doc["metadata"]["name"])
        return doc["metadata"]["name"]

    def wait(self, name: str, pred, what: str, timeout: float) -> dict:
        """The job's status once ``pred(status)`` holds; on timeout, the status and its pods' states."""
        try:
            return _wait(lambda: pred(st := self.status(name)) and st, what, timeout)
        except AssertionError as e:
            pods = {
                p.metadata.name: (p.status.phase, [c.state.to_dict() for c in p.status.container_statuses or []])
                for p in self.core.list_namespaced_pod(self.ns, label_selector=f"llmtrain.dev/job={name}").items
            }
            raise AssertionError(f"{e}\nstatus: {self.status(name)}\npods: {pods}") from None

    def status(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name).get("status") or {}

    def pods(self, name: str, attempt: int) -> list[client.V1Pod]:
        return self.core.list_namespaced_pod(self.ns, label_selector=attempt_pods(name, attempt)).items

    def running(self, name: str, attempt: int) -> list[client.V1Pod]:
        pods = [p for p in self.pods(name, attempt) if p.status.phase == "Running"]
        return pods if len(pods) == 2 else []

    def events(self, name: str) -> list[client.CoreV1Event]:
        return self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={name}").items

    def logs(self, pod: str) -> str:
        return self.core.read_namespaced_pod_log(pod, self.ns)

    def exec(self, pod: str, *cmd: str) -> str:
        return self.cluster.kubectl("exec", "-n", self.ns, pod, "-c", "pytorch", "--", *cmd).stdout

    def volume(self, name: str, *, read_only: bool = False) -> dict:
        """A directory of this test as a PersistentVolume on the real node, mounted at /ckpt."""
        claim = local_volume(self.cluster, self.ns, name, self.tmp / "volumes" / name)
        return {"name": name, "claimName": claim, "mountPath": "/ckpt", "readOnly": read_only}


@pytest.mark.slow(seconds=20)  # with the module's cluster start and image check (measured 17 s)
def test_an_image_the_node_does_not_hold_is_named_and_spends_no_restart(rp):
    real = rp
    missing = real.image.rsplit(":", 1)[0] + ":no-such-tag"
    name = real.apply(real.job("no-image", image=missing))
    st = real.wait(name, lambda st: st.get("reason") == "ErrImageNeverPull", "reason ErrImageNeverPull", 60)
    assert st["phase"] == "Pending" and not st.get("restarts"), st
    assert missing in st["message"] and "not present with pull policy of Never" in st["message"], st["message"]
    warnings = [e for e in real.events(name) if e.type == "Warning" and e.reason == "ErrImageNeverPull"]
    assert warnings and missing in warnings[0].message, [(e.reason, e.message) for e in real.events(name)]


@pytest.mark.slow(seconds=35)
def test_a_checkpoint_on_a_read_only_volume_fails_naming_the_path(rp):
    real = rp
    vol = real.volume("ro", read_only=True)
    name = real.apply(real.job("read-only", volumes=[vol], checkpoint="file:///ckpt/read-only/"))
    st = real.wait(name, lambda st: st.get("phase") == "Failed", "Failed", 180)
    # the trainer's own error, through the termination message the kubelet read: the path and why
    assert "/ckpt/read-only" in st["message"] and "Read-only file system" in st["message"], st["message"]
    assert not st.get("restarts"), st


@pytest.mark.slow(seconds=200)
@pytest.mark.parametrize("backend", ["pytorchjob", "jobset"])
def test_a_killed_worker_resumes_from_memory_then_sigterm_checkpoints_and_the_next_attempt_resumes_there(rp, backend):
    real = rp
    vol = real.volume(f"sigterm-{backend}")
    doc = on(real.job(f"sigterm-{backend}", steps=400, volumes=[vol], checkpoint=f"file:///ckpt/{backend}/"), backend)
    doc["spec"]["resilience"].update(maxRestarts=1, inPlaceRestarts=1)
    doc["spec"]["checkpoint"]["memory"] = {"intervalSteps": 5}
    name = real.apply(doc)
    pods = _wait(lambda: real.running(name, 1), "attempt 1's two pods Running", 180)
    rank0 = min(p.metadata.name for p in pods)
    # the kubelet enforces the rendered securityContext: the trainer's UID, no capability; and the
    # memory-backed /dev/shm and the staging volume are writable by it
    assert real.exec(rank0, "id", "-u").strip() == str(UID)
    caps = dict(line.split(":\t") for line in real.exec(rank0, "cat", "/proc/1/status").splitlines() if ":\t" in line)
    assert int(caps["CapEff"], 16) == 0 and int(caps["CapPrm"], 16) == 0, caps
    real.exec(rank0, "sh", "-c", "echo x > /dev/shm/probe && echo x > /var/lib/llmtrain/staging/probe")
    real.wait(name, lambda st: (st.get("progress") or {}).get("step", 0) >= 20, "step 20 scraped", 180)

    # a crashed worker: torchrun restarts the workers of both pods in place, and they resume from
    # their snapshots in /dev/shm (no durable checkpoint exists yet: without them, step 0)
    assert real.exec(rank0, "python", "-c", KILL_WORKER).split(), "no worker process in the pod"
    st = real.wait(
        name,
        lambda st: (
            (st.get("progress") or {}).get("inPlaceRestarts", 0) >= 1
            and st["progress"].get("resumeFrom") in ("memory", "partner")
            and st["progress"].get("step", 0) >= 40
        ),
        "an in-place restart resumed from memory, then step 40",
        180,
    )
    lines = [line for p in real.pods(name, 1) for line in real.logs(p.metadata.name).splitlines()]
    resumes = [e for line in lines if line.startswith("{") and (e := json.loads(line)).get("event") == "resume"]
    assert len(resumes) == 1 and resumes[0]["tier"] in ("memory", "partner"), resumes
    assert resumes[0]["step"] >= 15 and resumes[0]["step"] % 5 == 0, resumes
    assert st["phase"] == "Running" and not st.get("restarts"), st

    real.core.delete_namespaced_pod(rank0, real.ns)  # the kubelet's SIGTERM, then the grace period
    real.wait(name, lambda st: st.get("attempt") == 2, "attempt 2", 180)
    st = real.wait(name, lambda st: st.get("phase") == "Succeeded", "Succeeded", 300)
    saved = (real.tmp / "volumes" / vol["name"] / backend).glob("step-*")
    ckpts = sorted(int(p.name.removeprefix("step-")) for p in saved)
    # two checkpoints only: the one SIGTERM committed (at or past step 40: no periodic one is due
    # before the end) and the last step's
    assert len(ckpts) == 2 and 40 <= ckpts[0] < 400 == ckpts[1], ckpts
    first, second = st["goodput"]["attempts"][:2]
    assert first.get("resumeFrom") in ("memory", "partner"), first
    # ...and attempt 2 (new pods, an empty /dev/shm) started from exactly that one and trained to the end
    assert second["resumeStep"] == ckpts[0] and st["progress"]["step"] == 400, (ckpts, second, st["progress"])
    assert second["resumeFrom"] == "durable", second
    assert st["restarts"] == 1 and st["attempt"] == 2, st


@pytest.mark.slow(seconds=60)
def test_a_job_backend_job_trains_on_real_pods_whose_c10d_host_is_its_services_dns_name(rp):
    """The job backend's one piece no other backend has: the headless Service the operator creates,
    which CoreDNS serves. Rank 1's torchrun reaches rank 0's c10d store at `<job>-0.<job>` (the Job
    controller's hostname in the Service's subdomain): without the Service, or with a wrong
    subdomain or selector, that name does not resolve and the rendezvous never forms."""
    real = rp
    name = real.apply(on(real.job("dns-job"), "job"))
    st = real.wait(name, lambda st: st.get("phase") in ("Succeeded", "Failed"), "Succeeded", 240)
    assert (st["phase"], st["backend"], st.get("restarts", 0)) == ("Succeeded", "job", 0), st
    child = st["child"]
    pods = real.pods(name, 1)
    assert sorted(p.spec.hostname for p in pods) == [f"{child}-0", f"{child}-1"]
    assert {p.spec.subdomain for p in pods} == {child}
    (c,) = [c for c in pods[0].spec.containers if c.name == "pytorch"]
    assert f"--rdzv-endpoint={child}-0.{child}:29400" in c.args, c.args
    # both ranks trained together (rank 0's config line): the rendezvous formed through that name
    worlds = [
        e["world_size"]
        for p in pods
        for line in real.logs(p.metadata.name).splitlines()
        if line.startswith("{") and "world_size" in (e := json.loads(line))
    ]
    assert worlds and set(worlds) == {2}, worlds

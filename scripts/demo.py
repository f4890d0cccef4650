"""The local demo: the whole llmtrain path on one machine, no GPU, no cloud.

Run by `make demo` after the dev cluster is up (chain mode with a real node) and the chart is
installed (see the Makefile).
1. the operator runs as a local process with the Helm release's ServiceAccount token (the chart's
   RBAC, nothing more), beside a rendezvous etcd with the chart's security (HTTPS, client
   certificates of the rendezvous CA, the operator holding the CA) on the real node's bridge;
2. the simulated GPU fleet (kube-scheduler, kwok nodes shaped from the instance catalog, the real
   Kubeflow training-operator and JobSet controller): examples/llama2-7b-p5.yaml's pods are
   scheduled onto simulated p5.48xlarge nodes; under Kueue two such jobs share a queue with quota
   for one, the first on the PyTorchJob backend and the second on the JobSet backend, and each
   runs to Succeeded;
3. the real node (kubelet, containerd, runc, a CNI bridge, CoreDNS): examples/tiny-cpu.yaml as two
   real pods of the trainer image built from the Dockerfile (make trainer-image), one rank each, in
   a namespace that enforces Pod Security "restricted": once on the PyTorchJob backend with etcd
   rendezvous over mTLS (the Secret the operator writes, mounted as the rendered pod says), once on
   the JobSet backend with c10d through the JobSet's headless Service. The operator scrapes rank
   0's metrics on its pod IP; the kubelet writes the trainer's final summary as the container's
   termination message, which the operator puts into the status that marks the job Succeeded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from llmtrain import rendezvous_auth as ra
from llmtrain_devcluster import DevCluster
from llmtrain_devcluster.chain import COMPLETE_POD_LABEL
from llmtrain_devcluster.etcd import start_secured_etcd
from llmtrain_devcluster.node import NODE_NAME, import_image, job_on_the_node
from llmtrain_devcluster.node.lifecycle import read_info
from llmtrain_devcluster.process import free_port, log_tail, stop_process, wait_until
from llmtrain_devcluster.standins import exited
from llmtrain_devcluster.tools import find_tool

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / os.environ.get("DEV_CLUSTER_STATE", ".dev-cluster")
CACHE = Path(os.environ.get("LLMTRAIN_CACHE") or Path.home() / ".cache" / "llmtrain")
IMAGE_MANIFEST = CACHE / "trainer-image" / "current.json"  # written by scripts/trainer-image.sh
JOB_FILE = ROOT / "examples" / "tiny-cpu.yaml"
P5_JOB_FILE = ROOT / "examples" / "llama2-7b-p5.yaml"
NAMESPACE = "demo"
CHART_NAMESPACE = os.environ.get("CHART_NAMESPACE", "llmtrain-system")
P5_NAMESPACE = "demo-p5"
CHART_RELEASE = os.environ.get("CHART_RELEASE", "llmtrain")
CA_SECRET = "llmtrain-rendezvous-ca"
# etcd's usual client port, on the bridge address of this cluster's real node alone (each dev
# cluster's node has its own /24), so two clusters' etcds never meet
ETCD_PORT = 2379
LOG_LINE = 240  # kubectl logs lines as the demo prints them (the end line whole, with its pod prefix)


def say(text: str) -> None:
    print(f"\n\033[1m==> {text}\033[0m", flush=True)


def wait_for(fn, timeout: float, what: str):
    return wait_until(fn, timeout=timeout, what=f"demo: {what}", on_fail=SystemExit)


def main() -> int:
    cluster = DevCluster(STATE)
    if not cluster.is_running():
        raise SystemExit("demo: the dev cluster is not running (make dev-cluster DEV_CLUSTER_FLAGS=--real-node)")
    if not (cluster.chain and cluster.real_node):
        raise SystemExit(
            "demo: the demo's CPU jobs run as real pods: it needs the chain dev cluster with its real node "
            "(make dev-cluster-down, then make demo; or make dev-cluster DEV_CLUSTER_FLAGS=--real-node)"
        )
    kubectl = cluster.kubectl
    image = trainer_image(cluster)
    etcd, etcd_endpoint, ca_dir = rendezvous_etcd(cluster)
    say("operator: running with the Helm release's ServiceAccount token")
    liveness, metrics = free_port(), free_port()
    log_path = STATE / "operator.log"
    env = {**os.environ, "KUBECONFIG": str(STATE / "operator.kubeconfig")}
    operator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmtrain.controller",
            "--bind-address",
            "127.0.0.1",
            "--liveness-port",
            str(liveness),
            "--metrics-port",
            str(metrics),
            # what the release's Deployment gets from defaultEtcdEndpoint and rendezvousCASecret;
            # rank 0's metrics on its pod IP, at the rendered port: the operator's defaults
            "--default-etcd-endpoint",
            etcd_endpoint,
            "--rendezvous-ca-dir",
            str(ca_dir),
            "--progress-interval",
            "1",
            # both backends, as the chart's values for the demo enable them (Makefile: demo)
            "--backend",
            "pytorchjob",
            "--backend",
            "jobset",
        ],
        env=env,
        stdout=open(log_path, "w"),
        stderr=subprocess.STDOUT,
    )
    try:

        def healthy():
            if operator.poll() is not None:
                raise SystemExit(f"demo: operator exited:\n{log_tail(log_path)}")
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{liveness}/healthz", timeout=1).status == 200
            except OSError:
                return False

        wait_for(healthy, 60, "the operator")
        print(f"operator healthy; log: {log_path}")
        # The operator runs here as a local process; the release's own Deployment would only be a
        # pretend replica on a simulated node.
        kubectl(
            "scale",
            "deployment",
            "-n",
            CHART_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=llmtrain-operator",
            "--replicas=0",
        )
        if cluster.kueue:
            p5_queue_under_kueue(cluster)
        else:
            p5_on_simulated_nodes(cluster)
        cpu_jobs_on_the_real_node(cluster, image)
    finally:
        operator.terminate()
        try:
            operator.wait(15)
        except subprocess.TimeoutExpired:
            operator.kill()
        stop_process(etcd)
    say("done")
    print(
        f"The dev cluster is still up: export KUBECONFIG={STATE / 'kubeconfig'}\n"
        "The JobSet job's trainer pods stay, with their logs: kubectl logs -n demo -l llmtrain.dev/job=tiny-cpu-js\n"
        "(the training-operator deletes a PyTorchJob's worker-0 pod once the job succeeded)\n"
        "Stop it with: make dev-cluster-down"
    )
    return 0


def rendezvous_etcd(cluster: DevCluster) -> tuple[subprocess.Popen, str, Path]:
    """An etcd of the platform's own on the real node's bridge, secured as the chart's bundled one
    is (HTTPS, client certificates of the rendezvous CA required), and the release upgraded to use
    it (defaultEtcdEndpoint, rendezvousCASecret): the operator holds the CA and gives each
    namespace its own identity, delivered per attempt as a Secret that the pods mount. A new CA
    and an empty etcd on every run. Returns (process, endpoint, CA directory)."""
    node_ip = read_info(STATE)["ip"]
    endpoint = f"{node_ip}:{ETCD_PORT}"
    etcd_dir = STATE / "rendezvous-etcd"
    shutil.rmtree(etcd_dir, ignore_errors=True)
    ca_dir = etcd_dir / "ca"
    ca_dir.mkdir(parents=True)
    ca = ra.CertificateAuthority.generate()
    (ca_dir / ra.CA_KEY).write_bytes(ca.cert_pem)
    (ca_dir / "ca.key").write_bytes(ca.key_pem())
    say(f"rendezvous etcd at {endpoint} (the real node's bridge): HTTPS, client certificates of a new rendezvous CA")
    secret = cluster.kubectl(
        "create",
        "secret",
        "generic",
        CA_SECRET,
        "-n",
        CHART_NAMESPACE,
        f"--from-file={ca_dir}",
        "--dry-run=client",
        "-o",
        "yaml",
    ).stdout
    print(cluster.kubectl("apply", "-f", "-", input=secret).stdout.strip())
    cmd = [
        "upgrade",
        CHART_RELEASE,
        str(ROOT / "charts" / "llmtrain-operator"),
        "-n",
        CHART_NAMESPACE,
        "--reuse-values",
    ]
    cmd += ["--set", f"defaultEtcdEndpoint={endpoint}", "--set", f"rendezvousCASecret={CA_SECRET}"]
    print(f"helm upgrade {CHART_RELEASE} ... --reuse-values {' '.join(cmd[-4:])}")
    cluster.helm(*cmd)
    server = ca.issue("etcd-server", server_names=(node_ip,)).write(etcd_dir / "server")
    proc, _ = start_secured_etcd(
        etcd_dir / "data",
        host=node_ip,
        client_port=ETCD_PORT,
        cert=server / ra.CERT_KEY,
        key=server / ra.KEY_KEY,
        ca=server / ra.CA_KEY,
        log_path=etcd_dir / "etcd.log",
    )
    print(f"etcd serving https://{endpoint}; log: {etcd_dir / 'etcd.log'}")
    return proc, endpoint, ca_dir


def trainer_image(cluster: DevCluster) -> str:
    """The image make trainer-image built from the Dockerfile, imported into the real node's
    containerd (no registry: a no-op when the node already holds it); its reference."""
    try:
        manifest = json.loads(IMAGE_MANIFEST.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"demo: no trainer image ({IMAGE_MANIFEST}: {e}); build it with: make trainer-image") from e
    say(f"the trainer image built from the Dockerfile ({manifest['ref']}) on the real node")
    t0 = time.monotonic()
    imported = import_image(cluster, manifest["archive_path"])
    how = f"imported in {time.monotonic() - t0:.0f} s" if imported else "already there"
    print(
        f"{manifest['ref']} ({manifest['archive_bytes'] / 2**30:.1f} GiB, {manifest['manifest_digest'][:19]}…): {how}"
    )
    return manifest["ref"]


def cpu_jobs_on_the_real_node(cluster: DevCluster, image: str) -> None:
    """examples/tiny-cpu.yaml twice, as two real pods each: PyTorchJob + etcd rendezvous (mTLS),
    then JobSet + c10d (its headless Service's DNS name)."""
    kubectl = cluster.kubectl
    say("the real node beside the simulated fleet")
    print(
        kubectl(
            "get",
            "nodes",
            "-o",
            "custom-columns=NODE:.metadata.name,TYPE:.metadata.labels.node\\.kubernetes\\.io/instance-type,"
            "KUBELET:.status.nodeInfo.kubeletVersion,RUNTIME:.status.nodeInfo.containerRuntimeVersion,"
            "TAINTS:.spec.taints[*].key",
        ).stdout
    )
    kubectl("create", "namespace", NAMESPACE, check=False)
    say(f'namespace {NAMESPACE}: Pod Security "restricted" enforced (the API server refuses any pod that breaks it)')
    kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted", "--overwrite")
    print(kubectl("get", "namespace", NAMESPACE, "--show-labels").stdout)
    base = yaml.safe_load(JOB_FILE.read_text())
    run_cpu_job(kubectl, base, image, "pytorchjob", {"backend": "etcd"}, base["metadata"]["name"])
    run_cpu_job(kubectl, base, image, "jobset", {"backend": "c10d"}, base["metadata"]["name"] + "-js")


def run_cpu_job(kubectl, base: dict, image: str, backend: str, rendezvous: dict, name: str) -> None:
    # the image this machine built (never pulled) and the real node's label and taint: only pods
    # that ask for it land there; two pods of one rank each on its 2 CPUs
    job = job_on_the_node(base, image)
    job["metadata"] = {"name": name}
    spec = job["spec"]
    spec["cluster"].update(nodes=2, processesPerNode=1, backend=backend)
    spec["rendezvous"] = rendezvous
    # the checkpoints live in the pods (file:// inside the containers), so a rerun starts afresh
    kubectl("delete", "llmtj", name, "-n", NAMESPACE, "--ignore-not-found", "--wait=true")
    kubectl("delete", "pods", "-l", f"llmtrain.dev/job={name}", "-n", NAMESPACE, "--ignore-not-found", "--wait=true")
    rdzv = rendezvous["backend"]
    say(f"kubectl apply: {JOB_FILE.relative_to(ROOT)} as {name}, on the {backend} backend, {rdzv} rendezvous")
    print(yaml.safe_dump({"spec": {"cluster": spec["cluster"], "rendezvous": rendezvous}}, sort_keys=False))
    print(kubectl("apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump(job)).stdout.strip())
    child = f"{name}-a1"
    kind = "pytorchjob" if backend == "pytorchjob" else "jobset"
    wait_for(lambda: kubectl("get", kind, child, "-n", NAMESPACE, check=False).returncode == 0, 60, f"{kind} {child}")
    obj = yaml.safe_load(kubectl("get", kind, child, "-n", NAMESPACE, "-o", "yaml").stdout)
    pod_spec = (
        obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
        if kind == "pytorchjob"
        else obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    )
    container = pod_spec["containers"][0]
    say(f"the {kind} the operator created: its trainer container (kubectl get {kind} {child} -o yaml)")
    shown = {k: container[k] for k in ("image", "imagePullPolicy", "command", "args", "volumeMounts") if k in container}
    print(yaml.safe_dump({"containers[0]": shown, "securityContext": pod_spec.get("securityContext")}, sort_keys=False))

    selector = f"llmtrain.dev/job={name},llmtrain.dev/attempt=1"

    def pods() -> list[dict]:
        out = kubectl("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "json", check=False)
        return json.loads(out.stdout)["items"] if out.returncode == 0 else []

    def started() -> bool:
        ps = pods()
        return len(ps) == 2 and all(p["status"].get("phase") in ("Running", "Succeeded") for p in ps)

    wait_for(started, 180, f"two pods of {name} on {NODE_NAME}")
    say("its pods: real containers on the real node, with pod IPs on its bridge (kubectl get pods -o wide)")
    print(kubectl("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "wide").stdout)
    first = min(p["metadata"]["name"] for p in pods())  # index 0: the pod the operator scrapes
    # Both pods' logs: which pod's trainer is rank 0 (the one that prints the banner, the config,
    # steps and end lines) is the rendezvous' choice (etcd's by join order), not the pod's index.
    say(f"kubectl logs -f -l {selector} --prefix (the trainers of both pods; lines cut at {LOG_LINE} characters here)")
    # streams until the containers exit: the trainers' own lines, as on a real cluster
    with subprocess.Popen(
        [*kubectl_argv(), "logs", "-f", "-n", NAMESPACE, "-l", selector, "--prefix", "--max-log-requests=2"],
        stdout=subprocess.PIPE,
        text=True,
    ) as logs:
        for line in logs.stdout:
            line = line.rstrip("\n")
            print(line if len(line) <= LOG_LINE else line[: LOG_LINE - 1] + "…", flush=True)
    wait_for(lambda: job_phase(kubectl, name) in ("Succeeded", "Failed"), 180, f"{name} finished")
    say("final status: the trainer's final step, loss, tokens/s and MFU (its pod's termination message), no ETA")
    print(kubectl("get", "llmtj", name, "-n", NAMESPACE).stdout)
    # the health condition is the operator's reading of rank 0's /metrics, scraped at its pod IP
    conditions = json.loads(
        kubectl("get", "llmtj", name, "-n", NAMESPACE, "-o", "jsonpath={.status.conditions}").stdout or "[]"
    )
    health = next((c for c in conditions if c["type"] == "TrainingHealthy"), {})
    print(
        f"TrainingHealthy={health.get('status')} ({health.get('reason')}) since {health.get('lastTransitionTime')}: "
        f"{health.get('message')} (from the operator's scrapes of {first}'s /metrics at its pod IP)"
    )
    uid = kubectl("get", "llmtj", name, "-n", NAMESPACE, "-o", "jsonpath={.metadata.uid}").stdout
    print(
        kubectl(
            "get",
            "events",
            "-n",
            NAMESPACE,
            "--field-selector",
            f"involvedObject.uid={uid}",
            "--sort-by=.lastTimestamp",
        ).stdout
    )
    if job_phase(kubectl, name) != "Succeeded":
        raise SystemExit(f"demo: {name} did not succeed; operator log: {STATE / 'operator.log'}")


def job_phase(kubectl, name: str) -> str:
    return kubectl("get", "llmtj", name, "-n", NAMESPACE, "-o", "jsonpath={.status.phase}", check=False).stdout


def kubectl_argv() -> list[str]:
    return [str(find_tool("kubectl")), "--kubeconfig", str(STATE / "kubeconfig")]


def p5_on_simulated_nodes(cluster: DevCluster) -> None:
    """examples/llama2-7b-p5.yaml on the chain: operator → PyTorchJob → training-operator → pods →
    kube-scheduler → simulated p5.48xlarge nodes (kwok) → Running."""
    kubectl = cluster.kubectl
    doc = yaml.safe_load(P5_JOB_FILE.read_text())
    name, nodes = doc["metadata"]["name"], doc["spec"]["cluster"]["nodes"]
    say("simulated GPU nodes, shaped from the instance catalog (kwok)")
    print(
        kubectl(
            "get",
            "nodes",
            "-L",
            "node.kubernetes.io/instance-type",
            "-o",
            "custom-columns=NODE:.metadata.name,TYPE:.metadata.labels.node\\.kubernetes\\.io/"
            "instance-type,GPU:.status.allocatable.nvidia\\.com/gpu,"
            "EFA:.status.allocatable.vpc\\.amazonaws\\.com/efa,"
            'READY:.status.conditions[?(@.type=="Ready")].status',
        ).stdout
    )
    kubectl("create", "namespace", P5_NAMESPACE, check=False)
    kubectl("delete", "llmtj", name, "-n", P5_NAMESPACE, "--ignore-not-found", "--wait=true")
    sa = doc["spec"]["cluster"].get("serviceAccountName")
    if sa:
        kubectl("create", "serviceaccount", sa, "-n", P5_NAMESPACE, check=False)
    say(f"kubectl apply -n {P5_NAMESPACE} -f {P5_JOB_FILE.relative_to(ROOT)} ({nodes} × p5.48xlarge)")
    print(kubectl("apply", "-n", P5_NAMESPACE, "-f", str(P5_JOB_FILE)).stdout.strip())
    ptj = f"{name}-a1"

    def pods_running():
        out = kubectl(
            "get",
            "pods",
            "-n",
            P5_NAMESPACE,
            "-l",
            f"training.kubeflow.org/job-name={ptj}",
            "-o",
            'jsonpath={range .items[*]}{.status.phase}{"\\n"}{end}',
            check=False,
        ).stdout
        phases = out.split()
        return len(phases) == nodes and set(phases) == {"Running"}

    wait_for(pods_running, 120, f"{nodes} pods of {ptj} Running")
    say("its pods, scheduled by kube-scheduler onto the simulated p5 nodes (kubectl get pods -o wide)")
    print(
        kubectl(
            "get",
            "pods",
            "-n",
            P5_NAMESPACE,
            "-o",
            "custom-columns=POD:.metadata.name,"
            "STATUS:.status.phase,NODE:.spec.nodeName,GPU:.spec.containers[0].resources."
            "requests.nvidia\\.com/gpu,EFA:.spec.containers[0].resources.requests."
            "vpc\\.amazonaws\\.com/efa",
        ).stdout
    )
    wait_for(lambda: "Running" in kubectl("get", "llmtj", name, "-n", P5_NAMESPACE).stdout, 60, f"{name} Running")
    print(kubectl("get", "llmtj", "-n", P5_NAMESPACE).stdout)


def p5_queue_under_kueue(cluster: DevCluster) -> None:
    """Two 2-node p5 jobs in one Kueue queue with quota for one (the dev cluster's ClusterQueue holds
    exactly its kwok nodes), one per backend: the first's attempts PyTorchJobs, the second's JobSets
    (spec.cluster.backend). The first Running, the second Pending/Queued in Kueue's own words; when
    the first finishes (its pods exit 0), Kueue admits the second, it runs and, its pods done,
    succeeds."""
    kubectl = cluster.kubectl
    doc = yaml.safe_load(P5_JOB_FILE.read_text())
    first = doc["metadata"]["name"]
    second = f"{first}-next"
    say("simulated GPU nodes (kwok); Kueue's ClusterQueue has quota for exactly these")
    print(kubectl("get", "nodes", "-L", "node.kubernetes.io/instance-type").stdout)
    kubectl("create", "namespace", P5_NAMESPACE, check=False)
    for name in (first, second):
        kubectl("delete", "llmtj", name, "-n", P5_NAMESPACE, "--ignore-not-found", "--wait=true")
    sa = doc["spec"]["cluster"].get("serviceAccountName")
    if sa:
        kubectl("create", "serviceaccount", sa, "-n", P5_NAMESPACE, check=False)
    cluster.kueue_local_queue(P5_NAMESPACE, "p5")

    def apply(name: str, backend: str) -> None:
        job = {**doc, "metadata": {"name": name}}
        job["spec"] = {**doc["spec"], "cluster": {**doc["spec"]["cluster"], "queueName": "p5", "backend": backend}}
        print(kubectl("apply", "-n", P5_NAMESPACE, "-f", "-", input=yaml.safe_dump(job)).stdout.strip())

    def status(name: str) -> dict:
        out = kubectl("get", "llmtj", name, "-n", P5_NAMESPACE, "-o", "json", check=False)
        return (json.loads(out.stdout).get("status") or {}) if out.returncode == 0 else {}

    def pods(name: str) -> list[str]:
        return kubectl(
            "get",
            "pods",
            "-n",
            P5_NAMESPACE,
            "-l",
            f"llmtrain.dev/job={name},llmtrain.dev/attempt=1",  # the renderer's labels, on either backend
            "-o",
            "name",
            check=False,
        ).stdout.split()

    def show_pods() -> None:
        print(
            kubectl(
                "get",
                "pods",
                "-n",
                P5_NAMESPACE,
                "-o",
                "custom-columns=POD:.metadata.name,"
                "STATUS:.status.phase,NODE:.spec.nodeName,GPU:.spec.containers[0].resources."
                "requests.nvidia\\.com/gpu",
            ).stdout
        )

    say(
        f"two jobs like {P5_JOB_FILE.relative_to(ROOT)} (2 × p5.48xlarge each) in LocalQueue p5, quota for one: "
        f"{first} on the PyTorchJob backend, {second} on the JobSet backend"
    )
    apply(first, "pytorchjob")
    wait_for(lambda: status(first).get("phase") == "Running", 120, f"{first} Running")
    apply(second, "jobset")
    wait_for(lambda: status(second).get("reason") == "Queued", 90, f"{second} Queued")
    # Kueue's words ("insufficient unused quota ...") follow the first Queued write within seconds
    wait_for(lambda: "quota" in (status(second).get("message") or ""), 30, f"{second}'s message in Kueue's words")
    show_pods()
    say("kubectl get llmtj: one Running, one Queued (no restart spent, no start-up deadline running)")
    print(kubectl("get", "llmtj", "-n", P5_NAMESPACE).stdout)
    print(f"{second}: {status(second).get('message', '')}")

    say(f"{first} finishes (its pods exit 0): Kueue frees the quota and admits {second}")
    # worker 0 last: once it succeeds the training-operator marks the job Succeeded and may delete
    # the other pods (its clean-pod policy), so a pod already gone is not an error here
    for pod in sorted(pods(first), reverse=True):
        patch_status(kubectl, P5_NAMESPACE, exited(0), pod, check=False)
    wait_for(lambda: status(first).get("phase") == "Succeeded", 120, f"{first} Succeeded")
    wait_for(lambda: status(second).get("phase") == "Running", 180, f"{second} Running")
    show_pods()
    print(kubectl("get", "llmtj", "-n", P5_NAMESPACE).stdout)

    say(f"{second} finishes (its pods exit 0): its Job completes, then its JobSet, then the job")
    for pod in pods(second):  # kwok's pod-complete stage, asked by label (it completes no Job's pod unasked)
        kubectl("label", pod, "-n", P5_NAMESPACE, f"{COMPLETE_POD_LABEL}=true", check=False)
    wait_for(lambda: status(second).get("phase") == "Succeeded", 120, f"{second} Succeeded")
    print(
        kubectl(
            "get",
            "llmtj",
            "-n",
            P5_NAMESPACE,
            "-o",
            "custom-columns=BACKEND:.status.backend,NAME:.metadata.name,CHILD:.status.child,PHASE:.status.phase",
        ).stdout
    )


def patch_status(kubectl, namespace: str, body: dict, *target: str, check: bool = True) -> None:
    """Report a status as its own controller would (the kubelet, the training-operator): a merge
    patch of the status subresource of ``target`` ("pod", name; or "pod/name")."""
    kubectl(
        "patch", *target, "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(body), check=check
    )


if __name__ == "__main__":
    sys.exit(main())

"""The local demo: the whole llmtrain path on one machine, no GPU, no cloud.

Run by `make demo` after the dev cluster is up and the chart is installed (see the Makefile).
1. the operator runs as a local process with the Helm release's ServiceAccount token (the chart's
   RBAC, nothing more);
2. examples/tiny-cpu.yaml is applied; the rendered PyTorchJob and the job's status are shown;
3. on the default dev cluster (chain mode: kube-scheduler, kwok nodes shaped from the instance
   catalog, the real Kubeflow training-operator and JobSet controller), examples/llama2-7b-p5.yaml
   is applied too: its pods are scheduled onto the simulated p5.48xlarge nodes and Running; under
   Kueue two such jobs share a queue with quota for one, the first on the PyTorchJob backend and
   the second on the JobSet backend, and each runs to Succeeded;
4. the CPU job's pod runs on a simulated CPU node, but its trainer runs here: the demo points the
   pod at 127.0.0.1 and, when training ends, reports the container's exit as a kubelet would; the
   training-operator and the operator do the rest. The training itself is real: `llmtrain local`
   trains the same job with 2 CPU workers, and the operator scrapes that trainer's metrics into
   the job's status, as it scrapes rank 0 in a real cluster; the container's exit carries the
   trainer's final summary as its termination message, which the operator writes into the status
   that marks the job Succeeded.
   (With DEV_CLUSTER_MODE=light there is no training-operator: the demo writes the PyTorchJob's
   conditions itself.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

from llmtrain_devcluster import DevCluster
from llmtrain_devcluster.chain import COMPLETE_POD_LABEL
from llmtrain_devcluster.process import free_port, log_tail, wait_until
from llmtrain_devcluster.standins import exited, pytorchjob_conditions, running_at, worker0_pod

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / os.environ.get("DEV_CLUSTER_STATE", ".dev-cluster")
JOB_FILE = ROOT / "examples" / "tiny-cpu.yaml"
P5_JOB_FILE = ROOT / "examples" / "llama2-7b-p5.yaml"
NAMESPACE = "demo"
CHART_NAMESPACE = os.environ.get("CHART_NAMESPACE", "llmtrain-system")
P5_NAMESPACE = "demo-p5"


def say(text: str) -> None:
    print(f"\n\033[1m==> {text}\033[0m", flush=True)


def wait_for(fn, timeout: float, what: str):
    return wait_until(fn, timeout=timeout, what=f"demo: {what}", on_fail=SystemExit)


def main() -> int:
    cluster = DevCluster(STATE)
    if not cluster.is_running():
        raise SystemExit("demo: the dev cluster is not running (make dev-cluster)")
    kubectl = cluster.kubectl
    job = yaml.safe_load(JOB_FILE.read_text())
    name = job["metadata"]["name"]
    ptj = f"{name}-a1"

    chain = cluster.chain
    kubectl("create", "namespace", NAMESPACE, check=False)

    say("operator: running with the Helm release's ServiceAccount token")
    trainer_port, liveness, metrics = free_port(), free_port(), free_port()
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
            "--trainer-metrics-port",
            str(trainer_port),
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
        # A previous run's job carries the operator's finalizer: delete it while the operator runs.
        kubectl("delete", "llmtj", name, "-n", NAMESPACE, "--ignore-not-found", "--wait=true")
        kubectl(
            "delete", "pods", "-l", f"llmtrain.dev/job={name}", "-n", NAMESPACE, "--ignore-not-found", "--wait=true"
        )
        shutil.rmtree(job["spec"]["checkpoint"]["uri"].removeprefix("file://"), ignore_errors=True)
        if chain:
            # The operator runs here as a local process; the release's own Deployment would only
            # be a pretend replica on a simulated node (and take the CPU node the job needs).
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
            # The CPU job's pod needs a node without GPU taints: one simulated "cpu" node.
            if not kubectl("get", "nodes", "-l", "node.kubernetes.io/instance-type=cpu", "-o", "name").stdout.strip():
                cluster.add_nodes({"cpu": 1})

        say(f"kubectl apply -f {JOB_FILE.relative_to(ROOT)}")
        print(kubectl("apply", "-n", NAMESPACE, "-f", str(JOB_FILE)).stdout.strip())
        wait_for(
            lambda: kubectl("get", "pytorchjob", ptj, "-n", NAMESPACE, check=False).returncode == 0,
            60,
            f"PyTorchJob {ptj}",
        )
        say(f"the PyTorchJob the operator created (kubectl get pytorchjob {ptj} -o yaml, spec only)")
        obj = yaml.safe_load(kubectl("get", "pytorchjob", ptj, "-n", NAMESPACE, "-o", "yaml").stdout)
        container = obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
        container["env"] = [e for e in container["env"] if e["name"] != "LLMTRAIN_SPEC"] + [
            {"name": "LLMTRAIN_SPEC", "value": "<the job's spec as JSON>"}
        ]
        print(yaml.safe_dump({"spec": obj["spec"]}, sort_keys=False))
        # On the chain its pod may already run by now: Running is as good as Pending here.
        wait_for(
            lambda: any(
                p in kubectl("get", "llmtj", name, "-n", NAMESPACE).stdout
                for p in ("Pending", "Running")
                if chain or p == "Pending"
            ),
            30,
            "Pending",
        )
        print(kubectl("get", "llmtj", "-n", NAMESPACE).stdout)

        pod = f"{ptj}-worker-0"
        if chain:
            say(
                f"the training-operator made {pod}; the scheduler put it on a simulated CPU node; "
                "its trainer runs on this host, so the pod is pointed at 127.0.0.1"
            )
            wait_for(
                lambda: (
                    kubectl("get", "pod", pod, "-n", NAMESPACE, "-o", "jsonpath={.status.phase}", check=False).stdout
                    == "Running"
                ),
                120,
                f"{pod} Running",
            )
            patch_status(kubectl, NAMESPACE, running_at("127.0.0.1"), "pod", pod)
            print(kubectl("get", "pod", pod, "-n", NAMESPACE, "-o", "wide").stdout)
        else:
            say(
                "no kubelet here: marking the PyTorchJob Running and worker 0 at 127.0.0.1 (the "
                "training-operator's and kubelet's part)"
            )
            kubectl(
                "create",
                "-n",
                NAMESPACE,
                "-f",
                "-",
                input=yaml.safe_dump(worker0_pod(name, 1, container["image"], owner=obj)),
            )
            patch_status(kubectl, NAMESPACE, running_at("127.0.0.1"), "pod", pod)
            set_condition(kubectl, ptj, "Running")
        wait_for(lambda: "Running" in kubectl("get", "llmtj", name, "-n", NAMESPACE).stdout, 30, "Running")

        say(f"llmtrain local {JOB_FILE.relative_to(ROOT)}: real training, 2 CPU workers (gloo)")
        train = subprocess.run(
            [
                sys.executable,
                "-m",
                "llmtrain.cli",
                "local",
                str(JOB_FILE),
                "--metrics-port",
                str(trainer_port),
                "--workdir",
                str(STATE / "demo-run"),
            ]
        )
        if train.returncode != 0:
            raise SystemExit(f"demo: llmtrain local failed ({train.returncode})")
        say("kubectl get llmtj (progress as last scraped by the operator from the trainer's /metrics)")
        print(kubectl("get", "llmtj", "-n", NAMESPACE).stdout)

        # The kubelet's report of the container's exit, with the termination message the trainer
        # left on its clean exit (its final summary: llmtrain local writes it where a pod's launcher
        # would); the training-operator does the rest.
        final = STATE / "demo-run" / "final-summary"
        patch_status(kubectl, NAMESPACE, exited(0, final.read_text() if final.exists() else ""), "pod", pod)
        if not chain:
            set_condition(kubectl, ptj, "Succeeded")
        wait_for(lambda: "Succeeded" in kubectl("get", "llmtj", name, "-n", NAMESPACE).stdout, 30, "Succeeded")
        say("final status: the trainer's final step, loss, tokens/s and MFU (its pod's termination message), no ETA")
        print(kubectl("get", "llmtj", "-n", NAMESPACE).stdout)
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
    finally:
        operator.terminate()
        try:
            operator.wait(15)
        except subprocess.TimeoutExpired:
            operator.kill()
    say("done")
    print(f"The dev cluster is still up: export KUBECONFIG={STATE / 'kubeconfig'}\nStop it with: make dev-cluster-down")
    return 0


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


def set_condition(kubectl, ptj: str, ctype: str) -> None:
    current = json.loads(
        kubectl("get", "pytorchjob", ptj, "-n", NAMESPACE, "-o", "jsonpath={.status.conditions}").stdout or "[]"
    )
    conds = pytorchjob_conditions(current, ctype, ptj)
    patch_status(kubectl, NAMESPACE, {"status": {"conditions": conds}}, "pytorchjob", ptj)


if __name__ == "__main__":
    sys.exit(main())

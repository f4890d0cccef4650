"""The local demo: the whole llmtrain path on one machine, no GPU, no cloud.

Run by `make demo` after the dev cluster is up and the chart is installed (see the Makefile).
1. the operator runs as a local process with the Helm release's ServiceAccount token (the chart's
   RBAC, nothing more);
2. examples/tiny-cpu.yaml is applied; the rendered PyTorchJob and the job's status are shown;
3. there is no kubelet here, so the demo plays the training-operator's part: it marks the
   PyTorchJob Running and registers worker 0's pod at 127.0.0.1. The training itself is real:
   `llmtrain local` trains the same job with 2 CPU workers, and the operator scrapes that
   trainer's metrics into the job's status, as it scrapes rank 0 in a real cluster.
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
from llmtrain_devcluster.process import free_port, log_tail, wait_until
from llmtrain_devcluster.standins import pytorchjob_conditions, running_at, worker0_pod

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / os.environ.get("DEV_CLUSTER_STATE", ".dev-cluster")
JOB_FILE = ROOT / "examples" / "tiny-cpu.yaml"
NAMESPACE = "demo"


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

    kubectl("create", "namespace", NAMESPACE, check=False)
    kubectl("delete", "llmtj", name, "-n", NAMESPACE, "--ignore-not-found", "--wait=true")
    kubectl("delete", "pods", "-l", f"llmtrain.dev/job={name}", "-n", NAMESPACE, "--ignore-not-found",
            "--wait=true")
    shutil.rmtree(job["spec"]["checkpoint"]["uri"].removeprefix("file://"), ignore_errors=True)

    say("operator: running with the Helm release's ServiceAccount token")
    trainer_port, liveness, metrics = free_port(), free_port(), free_port()
    log_path = STATE / "operator.log"
    env = {**os.environ, "KUBECONFIG": str(STATE / "operator.kubeconfig")}
    operator = subprocess.Popen(
        [sys.executable, "-m", "llmtrain.controller", "--bind-address", "127.0.0.1",
         "--liveness-port", str(liveness), "--metrics-port", str(metrics),
         "--trainer-metrics-port", str(trainer_port), "--progress-interval", "1"],
        env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
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

        say(f"kubectl apply -f {JOB_FILE.relative_to(ROOT)}")
        print(kubectl("apply", "-n", NAMESPACE, "-f", str(JOB_FILE)).stdout.strip())
        wait_for(lambda: kubectl("get", "pytorchjob", ptj, "-n", NAMESPACE, check=False).returncode == 0,
                 60, f"PyTorchJob {ptj}")
        say(f"the PyTorchJob the operator created (kubectl get pytorchjob {ptj} -o yaml, spec only)")
        obj = yaml.safe_load(kubectl("get", "pytorchjob", ptj, "-n", NAMESPACE, "-o", "yaml").stdout)
        container = obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
        container["env"] = [e for e in container["env"] if e["name"] != "LLMTRAIN_SPEC"] + [
            {"name": "LLMTRAIN_SPEC", "value": "<the job's spec as JSON>"}]
        print(yaml.safe_dump({"spec": obj["spec"]}, sort_keys=False))
        wait_for(lambda: "Pending" in kubectl("get", "llmtj", name, "-n", NAMESPACE).stdout, 30, "Pending")
        print(kubectl("get", "llmtj", "-n", NAMESPACE).stdout)

        say("no kubelet here: marking the PyTorchJob Running and worker 0 at 127.0.0.1 (the "
            "training-operator's and kubelet's part)")
        kubectl("create", "-n", NAMESPACE, "-f", "-",
                input=yaml.safe_dump(worker0_pod(name, 1, container["image"])))
        kubectl("patch", "pod", f"{ptj}-worker-0", "-n", NAMESPACE, "--subresource=status", "--type=merge",
                "-p", json.dumps(running_at("127.0.0.1")))
        set_condition(kubectl, ptj, "Running")
        wait_for(lambda: "Running" in kubectl("get", "llmtj", name, "-n", NAMESPACE).stdout, 30, "Running")

        say(f"llmtrain local {JOB_FILE.relative_to(ROOT)}: real training, 2 CPU workers (gloo)")
        train = subprocess.run([sys.executable, "-m", "llmtrain.cli", "local", str(JOB_FILE),
                                "--metrics-port", str(trainer_port), "--workdir", str(STATE / "demo-run")])
        if train.returncode != 0:
            raise SystemExit(f"demo: llmtrain local failed ({train.returncode})")
        say("kubectl get llmtj (progress as last scraped by the operator from the trainer's /metrics)")
        print(kubectl("get", "llmtj", "-n", NAMESPACE).stdout)

        set_condition(kubectl, ptj, "Succeeded")
        wait_for(lambda: "Succeeded" in kubectl("get", "llmtj", name, "-n", NAMESPACE).stdout, 30, "Succeeded")
        say("final status")
        print(kubectl("get", "llmtj", "-n", NAMESPACE).stdout)
        uid = kubectl("get", "llmtj", name, "-n", NAMESPACE, "-o", "jsonpath={.metadata.uid}").stdout
        print(kubectl("get", "events", "-n", NAMESPACE, "--field-selector",
                      f"involvedObject.uid={uid}", "--sort-by=.lastTimestamp").stdout)
    finally:
        operator.terminate()
        try:
            operator.wait(15)
        except subprocess.TimeoutExpired:
            operator.kill()
    say("done")
    print(f"The dev cluster is still up: export KUBECONFIG={STATE / 'kubeconfig'}\n"
          "Stop it with: make dev-cluster-down")
    return 0


def set_condition(kubectl, ptj: str, ctype: str) -> None:
    current = json.loads(kubectl("get", "pytorchjob", ptj, "-n", NAMESPACE, "-o",
                                 "jsonpath={.status.conditions}").stdout or "[]")
    conds = pytorchjob_conditions(current, ctype, ptj)
    kubectl("patch", "pytorchjob", ptj, "-n", NAMESPACE, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"conditions": conds}}))


if __name__ == "__main__":
    sys.exit(main())

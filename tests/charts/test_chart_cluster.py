"""`helm install` the chart into the real dev cluster, then run the operator exactly as the
release's Deployment would (its command and args) as a local process authenticated only by the
release's ServiceAccount token: it must reconcile an example LLMTrainingJob into a PyTorchJob,
write status, post events and hold its leader-election Lease, then take a job through a failed
attempt, the restart, a suspension and its deletion (so the RBAC the chart grants is enough for
every API call of that lifecycle), while anything outside that RBAC (reading Secrets, creating
Deployments, writing the jobs themselves) is refused by the API server."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from chart_helpers import ROOT

from llmtrain_devcluster.process import free_port, wait_until

pytestmark = [pytest.mark.infra, pytest.mark.slow]

EXAMPLE = ROOT / "examples" / "tiny-cpu.yaml"
RELEASE = "llmtrain"


def wait_for(fn, timeout: float, what: str):
    """Poll `fn` until it returns something truthy; fail the test after `timeout` seconds."""
    return wait_until(fn, timeout=timeout, what=what, on_fail=AssertionError)


def http_ok(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read().decode() if r.status == 200 else None
    except OSError:
        return None


@pytest.fixture(scope="module")
def release(helm, dev_cluster, tmp_path_factory):
    """The chart installed with its defaults (and the admission allow-lists)."""
    from kubernetes import client

    ns = f"llmtrain-system-{os.getpid()}"
    with dev_cluster.api_client() as api:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    try:
        helm.run(
            "install",
            RELEASE,
            helm.operator_chart,
            "--namespace",
            ns,
            "--set",
            "admission.allowedImageRegistries={public.ecr.aws/llmtrain}",
            "--set",
            "admission.allowedServiceAccounts={llmtrain-trainer}",
            kubeconfig=dev_cluster.kubeconfig,
        )
        yield ns
    finally:
        helm.run("uninstall", RELEASE, "--namespace", ns, kubeconfig=dev_cluster.kubeconfig, check=False)
        with dev_cluster.api_client() as api:
            try:
                client.CoreV1Api(api).delete_namespace(ns)
            except client.ApiException as e:
                if e.status != 404:
                    raise


@pytest.fixture(scope="module")
def deployment(release, dev_cluster) -> dict:
    out = dev_cluster.kubectl(
        "get", "deployment", "-n", release, "-o", "json", "-l", f"app.kubernetes.io/instance={RELEASE}"
    ).stdout
    (dep,) = json.loads(out)["items"]
    return dep


@pytest.fixture(scope="module")
def sa_kubeconfig(release, deployment, dev_cluster, tmp_path_factory) -> Path:
    sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    return dev_cluster.serviceaccount_kubeconfig(release, sa, path=tmp_path_factory.mktemp("sa") / "kubeconfig")


@pytest.fixture(scope="module")
def operator_process(deployment, sa_kubeconfig, tmp_path_factory):
    """The Deployment's container command + args, run here with only the ServiceAccount's token.
    Ports are moved to free loopback ports; everything else is the release's."""
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["llmtrain-operator"]
    liveness, metrics = free_port(), free_port()
    args = []
    for a in c["args"]:
        if a.startswith("--liveness-port="):
            a = f"--liveness-port={liveness}"
        elif a.startswith("--metrics-port="):
            a = f"--metrics-port={metrics}"
        args.append(a)
    exe = Path(sys.executable).with_name("llmtrain-operator")
    assert exe.is_file(), f"console script missing: {exe}"
    log_path = tmp_path_factory.mktemp("operator") / "operator.log"
    # The container's literal env (e.g. the admission allow-lists), then what the kubelet would fill in.
    literal = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    env = {
        **os.environ,
        **literal,
        "KUBECONFIG": str(sa_kubeconfig),
        "POD_NAME": "llmtrain-operator-test-0",
        "POD_NAMESPACE": deployment["metadata"]["namespace"],
    }
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [str(exe), *args, "--bind-address=127.0.0.1"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    probe = c["livenessProbe"]["httpGet"]["path"]
    try:
        wait_for(
            lambda: proc.poll() is not None or http_ok(f"http://127.0.0.1:{liveness}{probe}"),
            60,
            "the operator's health endpoint",
        )
        assert proc.poll() is None, f"operator exited {proc.returncode}:\n{log_path.read_text()[-4000:]}"
        yield {"proc": proc, "log": log_path, "metrics": metrics, "liveness": liveness, "args": args}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


# Any refusal in the operator's log: kopf's and the client's "forbidden: User ... cannot", and the
# operator's own warnings ("cannot list nodes of cpu: 403 Forbidden", "cannot list the pods of ...:
# Forbidden").
DENIED = re.compile(r'forbidden: User "system:serviceaccount:[^"]+" cannot|\bForbidden\b')


def denials(operator_process) -> list[str]:
    return [line for line in operator_process["log"].read_text().splitlines() if DENIED.search(line)]


def test_release_objects_exist(release, deployment, dev_cluster):
    assert deployment["spec"]["replicas"] == 1
    crds = dev_cluster.kubectl("get", "crd", "-o", "name").stdout.split()
    assert "customresourcedefinition.apiextensions.k8s.io/llmtrainingjobs.llmtrain.dev" in crds


def test_operator_with_release_credentials_reconciles_an_example_job(
    operator_process, release, dev_cluster, sa_kubeconfig
):
    job = yaml.safe_load(EXAMPLE.read_text())
    name = job["metadata"]["name"]
    dev_cluster.kubectl("apply", "-n", release, "-f", EXAMPLE)

    def ptjs():
        out = dev_cluster.kubectl("get", "pytorchjobs.kubeflow.org", "-n", release, "-o", "json").stdout
        return [
            p
            for p in json.loads(out)["items"]
            if any(
                o.get("kind") == "LLMTrainingJob" and o.get("name") == name
                for o in p["metadata"].get("ownerReferences") or []
            )
        ]

    def log_tail():
        return operator_process["log"].read_text()[-4000:]

    try:
        (ptj,) = wait_for(ptjs, 90, f"a PyTorchJob owned by {name}")
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- operator log ---\n{log_tail()}") from None
    assert ptj["metadata"]["labels"]["llmtrain.dev/job"] == name

    def status():
        out = json.loads(dev_cluster.kubectl("get", "llmtj", name, "-n", release, "-o", "json").stdout)
        st = out.get("status") or {}
        return st if st.get("phase") else None

    st = wait_for(status, 60, "status.phase (status subresource patched)")
    assert st["phase"] in ("Pending", "Running"), st
    assert st.get("child") == ptj["metadata"]["name"]

    # Events posted with the operator's identity (core/events.k8s.io create).
    def events():
        out = dev_cluster.kubectl(
            "get", "events", "-n", release, "-o", "json", "--field-selector", f"involvedObject.name={name}"
        ).stdout
        return json.loads(out)["items"]

    assert wait_for(events, 30, f"events about {name}")

    # The leader-election Lease (leader.py), held with the identity of this replica.
    def lease():
        out = json.loads(dev_cluster.kubectl("get", "lease", "llmtrain-operator", "-n", release, "-o", "json").stdout)
        return (out.get("spec") or {}).get("holderIdentity") == "llmtrain-operator-test-0"

    assert wait_for(lease, 30, "the operator's leader-election Lease")

    # Nothing the operator (or kopf under it) tried was refused by RBAC.
    denied = denials(operator_process)
    assert not denied, "RBAC denials in the operator log:\n" + "\n".join(denied[:10])

    # Its metrics endpoint serves the operator's series.
    body = http_ok(f"http://127.0.0.1:{operator_process['metrics']}/metrics") or ""
    assert "llmtrain_operator_reconciles_total" in body
    assert operator_process["proc"].poll() is None, log_tail()


def test_operator_with_release_credentials_takes_a_job_through_its_lifecycle(operator_process, release, dev_cluster):
    """Failed attempt (a worker pod failed on a node) -> restart (the failure read from the pod
    watch, the instance type's nodes listed for bad-node avoidance, the old PyTorchJob deleted,
    attempt 2 created) -> Running -> suspend (PyTorchJob deleted) -> resume (attempt 3) ->
    Succeeded -> job deleted. Every call the operator makes on the way runs with the chart's RBAC
    only, and none is refused."""
    from kubernetes import client

    from llmtrain.render import ATTEMPT_LABEL, JOB_LABEL
    from llmtrain_devcluster.standins import pytorchjob_conditions

    job = yaml.safe_load(EXAMPLE.read_text())
    name = job["metadata"]["name"] = "rbac-lifecycle"
    job["spec"]["resilience"]["restartBackoffSeconds"] = 0
    dev_cluster.kubectl("apply", "-n", release, "-f", "-", input=yaml.safe_dump(job))

    def log_tail():
        return operator_process["log"].read_text()[-4000:]

    def job_status():
        out = json.loads(dev_cluster.kubectl("get", "llmtj", name, "-n", release, "-o", "json").stdout)
        return out.get("status") or {}

    def ptj_names():
        out = json.loads(
            dev_cluster.kubectl(
                "get", "pytorchjobs.kubeflow.org", "-n", release, "-o", "json", "-l", f"llmtrain.dev/job={name}"
            ).stdout
        )
        return {p["metadata"]["name"] for p in out["items"] if not p["metadata"].get("deletionTimestamp")}

    try:
        wait_for(lambda: ptj_names() == {f"{name}-a1"}, 90, "attempt 1's PyTorchJob")

        # A worker that failed on its node, then the training-operator's verdict, written as the
        # kubelet and the training-operator would (admin credentials, status subresources).
        def set_ptj(ptj_name: str, ctype: str, message: str = ""):
            with dev_cluster.api_client() as api:
                custom = client.CustomObjectsApi(api)
                ptj = custom.get_namespaced_custom_object("kubeflow.org", "v1", release, "pytorchjobs", ptj_name)
                conds = pytorchjob_conditions(
                    (ptj.get("status") or {}).get("conditions") or [], ctype, ptj_name, message
                )
                custom.patch_namespaced_custom_object_status(
                    "kubeflow.org", "v1", release, "pytorchjobs", ptj_name, {"status": {"conditions": conds}}
                )

        with dev_cluster.api_client() as api:
            core = client.CoreV1Api(api)
            pod = f"{name}-a1-worker-0"
            owner = client.CustomObjectsApi(api).get_namespaced_custom_object(
                "kubeflow.org", "v1", release, "pytorchjobs", f"{name}-a1"
            )["metadata"]["uid"]
            # controlled by attempt 1's PyTorchJob, as the training-operator makes it (a pod that
            # only carries the labels is anyone's and feeds no forensics)
            core.create_namespaced_pod(
                release,
                {
                    "metadata": {
                        "name": pod,
                        "labels": {JOB_LABEL: name, ATTEMPT_LABEL: "1"},
                        "ownerReferences": [
                            {
                                "apiVersion": "kubeflow.org/v1",
                                "kind": "PyTorchJob",
                                "name": f"{name}-a1",
                                "uid": owner,
                                "controller": True,
                            }
                        ],
                    },
                    "spec": {"nodeName": "cpu-node-7", "containers": [{"name": "trainer", "image": "busybox"}]},
                },
            )
            core.patch_namespaced_pod_status(
                pod,
                release,
                {
                    "status": {
                        "phase": "Failed",
                        "containerStatuses": [
                            {
                                "name": "trainer",
                                "image": "busybox",
                                "imageID": "",
                                "ready": False,
                                "restartCount": 0,
                                "state": {
                                    "terminated": {"exitCode": 1, "reason": "Error", "message": "worker exited 1"}
                                },
                            }
                        ],
                    }
                },
            )
        set_ptj(f"{name}-a1", "Failed", "worker exited 1")
        wait_for(lambda: ptj_names() == {f"{name}-a2"}, 90, "attempt 2 replacing attempt 1")
        st = job_status()
        assert st.get("attempt") == 2 and st.get("restarts") == 1, st
        assert [b["node"] for b in st.get("badNodes") or []] == ["cpu-node-7"], st
        set_ptj(f"{name}-a2", "Running")
        wait_for(lambda: job_status().get("phase") == "Running", 60, "phase Running")

        dev_cluster.kubectl("patch", "llmtj", name, "-n", release, "--type=merge", "-p", '{"spec":{"suspend":true}}')
        wait_for(
            lambda: job_status().get("phase") == "Suspended" and not ptj_names(),
            60,
            "the suspended job's PyTorchJob deleted",
        )
        dev_cluster.kubectl("patch", "llmtj", name, "-n", release, "--type=merge", "-p", '{"spec":{"suspend":false}}')
        wait_for(lambda: ptj_names() == {f"{name}-a3"}, 60, "attempt 3 after the resume")
        set_ptj(f"{name}-a3", "Succeeded")
        wait_for(lambda: job_status().get("phase") == "Succeeded", 60, "phase Succeeded")

        dev_cluster.kubectl("delete", "llmtj", name, "-n", release, "--wait=true", timeout=60)
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- operator log ---\n{log_tail()}") from None

    denied = denials(operator_process)
    assert not denied, "RBAC denials in the operator log:\n" + "\n".join(denied[:10])
    assert operator_process["proc"].poll() is None, log_tail()


@pytest.mark.parametrize(
    "verb,resource,extra",
    [
        ("get", "secrets", []),
        ("list", "secrets", ["--all-namespaces"]),
        ("create", "deployments.apps", []),
        ("delete", "llmtrainingjobs.llmtrain.dev", []),
        # the operator writes only the status subresource of its jobs, never the jobs themselves
        ("patch", "llmtrainingjobs.llmtrain.dev", []),
        ("update", "llmtrainingjobs.llmtrain.dev", []),
        ("update", "llmtrainingjobs.llmtrain.dev", ["--subresource=status"]),
        ("patch", "pytorchjobs.kubeflow.org", []),
        # the default release enables only the pytorchjob backend
        ("create", "jobsets.jobset.x-k8s.io", []),
        ("get", "jobs.batch", []),
        ("get", "pods", []),
        ("create", "events.events.k8s.io", []),
        ("delete", "pods", []),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", []),
        ("patch", "nodes", []),
    ],
)
def test_actions_outside_the_rbac_are_denied(release, dev_cluster, sa_kubeconfig, verb, resource, extra):
    r = dev_cluster.kubectl(
        "auth", "can-i", verb, resource, "-n", release, *extra, kubeconfig=sa_kubeconfig, check=False
    )
    assert r.stdout.strip() == "no", (verb, resource, r.stdout, r.stderr)


def test_reading_a_secret_is_forbidden_by_the_api_server(release, dev_cluster, sa_kubeconfig):
    dev_cluster.kubectl("create", "secret", "generic", "hf-token", "-n", release, "--from-literal=token=x")
    r = dev_cluster.kubectl("get", "secret", "hf-token", "-n", release, kubeconfig=sa_kubeconfig, check=False)
    assert r.returncode != 0
    assert "Forbidden" in r.stderr and 'cannot get resource "secrets"' in r.stderr, r.stderr


def test_what_the_operator_needs_is_allowed(release, dev_cluster, sa_kubeconfig):
    """Every verb of the operator's RBAC table (llmtrain/controller/rbac.py), asked of the API server."""
    from llmtrain.controller import rbac

    # Asked as SelfSubjectAccessReviews with the group, resource and subresource spelled out: `kubectl
    # auth can-i` maps names through discovery, so it answers "no" for a kind whose CRD is not
    # installed here (Kueue's Workloads), and reads `<resource>/status` as an object NAME.
    # (the release namespace is also the operator's own: its reliability ConfigMap lives there)
    rules = {**rbac.JOB_RULES, **rbac.BACKEND_RULES["pytorchjob"], **rbac.CLUSTER_RULES, **rbac.RELIABILITY_RULES}
    needs = [(g, r, v) for (g, r), verbs in rules.items() for v in verbs]
    for group, resource, verb in sorted(needs):
        plural, _, sub = resource.partition("/")
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "group": group,
                    "resource": plural,
                    "subresource": sub,
                    "verb": verb,
                    "namespace": release,
                }
            },
        }
        r = dev_cluster.kubectl(
            "create", "-o", "json", "-f", "-", input=json.dumps(review), kubeconfig=sa_kubeconfig, check=False
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["status"].get("allowed") is True, (verb, group, resource, r.stdout)


@pytest.fixture(scope="module")
def users(release, dev_cluster, tmp_path_factory):
    """Two users with client certificates, bound to the built-in `edit` and `view` roles in the
    release namespace; nothing llmtrain-specific is bound to them."""
    out = {}
    for user, role in (("alice-edit", "edit"), ("bob-view", "view")):
        out[role] = dev_cluster.make_user_kubeconfig(user, path=tmp_path_factory.mktemp(user) / "kubeconfig")
        dev_cluster.kubectl(
            "create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}", f"--user={user}", "-n", release
        )
    return out


def can_i(dev_cluster, kubeconfig, release, verb, resource, *extra) -> str:
    return dev_cluster.kubectl(
        "auth", "can-i", verb, resource, "-n", release, *extra, kubeconfig=kubeconfig, check=False
    ).stdout.strip()


def test_edit_and_view_users_get_llmtrain_access_through_aggregation(release, dev_cluster, users):
    jobs = "llmtrainingjobs.llmtrain.dev"
    # The clusterrole-aggregation controller merges llmtrain-edit into `edit` asynchronously.
    wait_for(
        lambda: can_i(dev_cluster, users["edit"], release, "create", jobs) == "yes",
        60,
        "`edit` to include llmtrain-edit (kubectl auth can-i create llmtrainingjobs as an edit user)",
    )
    for verb in ("get", "list", "watch", "update", "patch", "delete"):
        assert can_i(dev_cluster, users["edit"], release, verb, jobs) == "yes", verb
    assert can_i(dev_cluster, users["edit"], release, "patch", jobs, "--subresource=status") == "no"
    assert can_i(dev_cluster, users["edit"], release, "get", jobs, "--subresource=status") == "yes"
    wait_for(lambda: can_i(dev_cluster, users["view"], release, "list", jobs) == "yes", 60, "`view` aggregation")
    for verb in ("create", "delete", "patch"):
        assert can_i(dev_cluster, users["view"], release, verb, jobs) == "no", verb
    # And the API server agrees for a real object created by the edit user.
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"] = {"name": "by-alice"}
    r = dev_cluster.kubectl(
        "create", "-n", release, "-f", "-", input=json.dumps(job), kubeconfig=users["edit"], check=False
    )
    assert r.returncode == 0, r.stderr
    assert dev_cluster.kubectl("get", "llmtj", "by-alice", "-n", release, kubeconfig=users["view"]).returncode == 0
    dev_cluster.kubectl("delete", "llmtj", "by-alice", "-n", release, kubeconfig=users["edit"])


@pytest.mark.parametrize(
    "field,value,reason",
    [
        ("image", "docker.io/someone/miner:latest", "spec.cluster.image"),
        ("image", "public.ecr.aws/llmtrain-lookalike/trainer:1", "spec.cluster.image"),
        ("serviceAccountName", "cluster-admin-sa", "spec.cluster.serviceAccountName"),
    ],
)
def test_allow_lists_from_chart_values_fail_jobs_outside_them(
    operator_process, release, dev_cluster, field, value, reason
):
    """Issue 10, defect 8: chart values admission.* → the operator's environment → validation."""
    job = yaml.safe_load(EXAMPLE.read_text())
    name = f"deny-{field.lower()[:5]}-{abs(hash(value)) % 10000}"
    job["metadata"] = {"name": name}
    job["spec"]["cluster"][field] = value
    dev_cluster.kubectl("create", "-n", release, "-f", "-", input=json.dumps(job))

    def failed():
        st = (
            json.loads(dev_cluster.kubectl("get", "llmtj", name, "-n", release, "-o", "json").stdout).get("status")
            or {}
        )
        return st if st.get("phase") == "Failed" else None

    st = wait_for(failed, 60, f"{name} marked Failed by the allow-list")
    assert reason in st.get("message", ""), st
    ptjs = json.loads(dev_cluster.kubectl("get", "pytorchjobs.kubeflow.org", "-n", release, "-o", "json").stdout)
    assert not [p for p in ptjs["items"] if p["metadata"]["name"].startswith(name)]
    dev_cluster.kubectl("delete", "llmtj", name, "-n", release)


def test_notes_show_how_to_watch_a_gpu_node_with_the_debug_tools(helm, release, dev_cluster):
    notes = helm.run(
        "install",
        "notes-check",
        helm.operator_chart,
        "--dry-run",
        "-n",
        release,
        "--set",
        "debugTools.enabled=true",
        "--set",
        "rbac.userRoles=false",
        kubeconfig=dev_cluster.kubeconfig,
    ).stdout
    assert f"kubectl exec -it -n {release} $POD -c nvtop -- nvtop" in notes
    assert "-l app.kubernetes.io/name=llmtrain-debug-tools,app.kubernetes.io/instance=notes-check" in notes


def test_notes_name_each_enabled_backends_crd_and_kueue_integration(helm, release, dev_cluster):
    """From the chart's files/backends.json (the registry's): a CRD to check for each backend that
    has one, none for the job backend's built-in kind, and whether Kueue's defaults manage it."""
    notes = helm.run(
        "install",
        "notes-backends",
        helm.operator_chart,
        "--dry-run",
        "-n",
        release,
        "--set",
        "backends.enabled={pytorchjob,jobset,job}",
        "--set",
        "rbac.userRoles=false",
        kubeconfig=dev_cluster.kubeconfig,
    ).stdout
    notes = notes[notes.index("NOTES:") :]
    assert "kubectl get crd pytorchjobs.kubeflow.org" in notes and "kubectl get crd jobsets.jobset.x-k8s.io" in notes
    assert "crd jobs.batch" not in notes and "# job: Jobs are served by Kubernetes itself" in notes
    assert "batch/job: in Kueue's default integrations" in notes
    assert "jobset.x-k8s.io/jobset: in Kueue's default integrations" in notes
    assert "kubeflow.org/pytorchjob: deprecated, and left out of Kueue's default integrations" in notes

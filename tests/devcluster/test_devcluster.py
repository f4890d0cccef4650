"""The local control plane is the real thing: version, RBAC, garbage collection, CRD validation,
and a CLI that leaves no process behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from llmtrain_devcluster import (
    DevCluster,
    DevClusterError,
    KubectlError,
    ToolNotFoundError,
    find_tool,
    start_etcd,
    stop_process,
)
from llmtrain_devcluster.process import is_running, read_pids
from llmtrain_devcluster.tools import TOOLS, tools_dir, tools_key

REPO = Path(__file__).resolve().parents[2]


def _pinned_kubernetes_version() -> str:
    for line in (REPO / "tools" / "k8s" / "pins.env").read_text().splitlines():
        if line.startswith("KUBERNETES_VERSION="):
            return line.split("=", 1)[1].strip()
    raise AssertionError("KUBERNETES_VERSION not pinned")


def _eventually(fn, *, timeout: float = 60.0, what: str = "condition"):
    """Poll ``fn`` until it returns a truthy value; bounded, with a short backoff."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    last = None
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except client.ApiException as e:
            last = e
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    raise AssertionError(f"{what} not reached within {timeout}s (last error: {last})")


# --- tools ---------------------------------------------------------------------------------


def test_all_pinned_tools_are_installed(kube_tools, monkeypatch):
    monkeypatch.delenv("LLMTRAIN_TOOLS_DIR", raising=False)
    # Python finds the very directory install-tools.sh filled for this checkout's pins.
    assert tools_dir().name == tools_key()
    for name in TOOLS:
        p = find_tool(name)
        assert p.is_file() and os.access(p, os.X_OK), p


def test_find_tool_tells_the_user_to_run_make_tools(tmp_path, monkeypatch):
    # No tool is used: the lookup goes to an empty directory on purpose (so no `tools` marker).
    monkeypatch.delenv("LLMTRAIN_TEST_WITHOUT_TOOLS")
    monkeypatch.setenv("LLMTRAIN_TOOLS_DIR", str(tmp_path))
    with pytest.raises(ToolNotFoundError, match="make tools"):
        find_tool("kube-apiserver")


def test_helm_is_v3(kube_tools):
    out = subprocess.run([find_tool("helm"), "version", "--short"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("v3."), out.stdout


def test_start_etcd_serves_the_v2_api_for_torch_rendezvous(kube_tools, tmp_path):
    proc, url = start_etcd(tmp_path / "etcd", enable_v2=True)
    try:
        assert url.startswith("http://127.0.0.1:")
        req = urllib.request.Request(f"{url}/v2/keys/llmtrain/probe", data=b"value=ok", method="PUT")
        req.add_header("Content-Type", "application/x-www-form-urlencoded")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=10) as r:
            assert r.status in (200, 201)
        with opener.open(f"{url}/v2/keys/llmtrain/probe", timeout=10) as r:
            assert json.load(r)["node"]["value"] == "ok"
    finally:
        stop_process(proc)
    assert proc.poll() is not None


# --- the running control plane ------------------------------------------------------------


def test_apiserver_serves_and_reports_its_version(dev_cluster):
    assert dev_cluster.server.startswith("https://127.0.0.1:")
    with dev_cluster.api_client() as api:
        info = client.VersionApi(api).get_code()
    assert info.git_version == _pinned_kubernetes_version()
    out = dev_cluster.kubectl("version", "-o", "json").stdout
    assert json.loads(out)["serverVersion"]["gitVersion"] == _pinned_kubernetes_version()


def test_rbac_is_enforced_for_a_user_without_bindings(dev_cluster, namespace):
    kc = dev_cluster.make_user_kubeconfig("alice", groups=["llmtrain:testers"])
    with dev_cluster.api_client(kc) as api:
        with pytest.raises(client.ApiException) as e:
            client.CoreV1Api(api).list_namespaced_secret(namespace)
    assert e.value.status == 403

    with dev_cluster.api_client() as api:
        rbac = client.RbacAuthorizationV1Api(api)
        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "secret-reader"},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "alice-reads-secrets"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "secret-reader"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
            },
        )

    with dev_cluster.api_client(kc) as api:
        core = client.CoreV1Api(api)
        # The RBAC authorizer sees the new binding through its informer: poll, bounded.
        _eventually(
            lambda: core.list_namespaced_secret(namespace) is not None, timeout=30, what="alice allowed to list secrets"
        )
        # ...and only there, and only reading.
        with pytest.raises(client.ApiException) as e:
            core.list_namespaced_secret("default")
        assert e.value.status == 403
        with pytest.raises(client.ApiException) as e:
            core.create_namespaced_secret(namespace, {"metadata": {"name": "nope"}})
        assert e.value.status == 403


def test_serviceaccount_token_kubeconfig_is_subject_to_rbac(dev_cluster, namespace):
    kc = dev_cluster.serviceaccount_kubeconfig(namespace, "worker", create=True)
    r = dev_cluster.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}", kubeconfig=kc)
    assert r.stdout == f"system:serviceaccount:{namespace}:worker"
    denied = dev_cluster.kubectl("get", "configmaps", "-n", namespace, kubeconfig=kc, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    dev_cluster.kubectl(
        "create",
        "rolebinding",
        "worker-view",
        "-n",
        namespace,
        "--clusterrole=view",
        f"--serviceaccount={namespace}:worker",
    )
    _eventually(
        lambda: dev_cluster.kubectl("get", "configmaps", "-n", namespace, kubeconfig=kc, check=False).returncode == 0,
        timeout=30,
        what="serviceaccount allowed to list configmaps",
    )


def test_garbage_collector_deletes_dependents_of_a_deleted_owner(dev_cluster, namespace):
    with dev_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
        core.create_namespaced_config_map(
            namespace,
            {
                "metadata": {
                    "name": "dependent",
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "ConfigMap",
                            "name": "owner",
                            "uid": owner.metadata.uid,
                        }
                    ],
                },
            },
        )
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "bystander"}})

        core.delete_namespaced_config_map("owner", namespace)

        def dependent_gone() -> bool:
            try:
                core.read_namespaced_config_map("dependent", namespace)
            except client.ApiException as e:
                if e.status == 404:
                    return True
                raise
            return False

        _eventually(dependent_gone, timeout=90, what="garbage collection of the dependent ConfigMap")
        # The collector deletes dependents only: an unrelated object survives.
        assert core.read_namespaced_config_map("bystander", namespace).metadata.name == "bystander"


def _pytorchjob(name: str, replicas) -> dict:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": replicas,
                    "restartPolicy": "OnFailure",
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "pytorch",
                                    "image": "example.invalid/llmtrain-trainer:dev",
                                    "command": ["python", "-m", "llmtrain.trainer"],
                                }
                            ]
                        }
                    },
                },
            },
        },
    }


def test_kubeflow_pytorchjob_crd_validates_server_side(dev_cluster, namespace):
    crd = json.loads(dev_cluster.kubectl("get", "crd", "pytorchjobs.kubeflow.org", "-o", "json").stdout)
    conds = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conds.get("Established") == "True"

    ok = dev_cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(_pytorchjob("valid", 2))
    )
    assert "pytorchjob.kubeflow.org/valid created (server dry run)" in ok.stdout

    bad = dev_cluster.kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        "-",
        input=yaml.safe_dump(_pytorchjob("invalid", "two")),
        check=False,
    )
    assert bad.returncode != 0
    assert "replicas" in bad.stderr and "integer" in bad.stderr, bad.stderr

    # Dry runs persist nothing.
    listed = json.loads(dev_cluster.kubectl("get", "pytorchjobs", "-n", namespace, "-o", "json").stdout)
    assert listed["items"] == []


def _jobset(name: str, replicas) -> dict:
    pod = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {"replicatedJobs": [{"name": "node", "replicas": replicas, "template": {"spec": {"template": pod}}}]},
    }


@pytest.mark.parametrize(
    ("crd", "plural", "make"),
    [
        ("pytorchjobs.kubeflow.org", "pytorchjob.kubeflow.org", _pytorchjob),
        ("jobsets.jobset.x-k8s.io", "jobset.jobset.x-k8s.io", _jobset),
    ],
    ids=["pytorchjob", "jobset"],
)
def test_backend_crd_is_installed_in_a_light_cluster_and_validates_server_side(
    dev_cluster, namespace, crd, plural, make
):
    """Both backends' CRDs are every dev cluster's (no controller in light mode: objects, RBAC and
    schema only): Established, a valid object passes a server dry run, a string where the schema
    says integer is refused naming the field, and a dry run persists nothing."""
    got = json.loads(dev_cluster.kubectl("get", "crd", crd, "-o", "json").stdout)
    assert {c["type"]: c["status"] for c in got["status"]["conditions"]}.get("Established") == "True"

    ok = dev_cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(make("valid", 1))
    )
    assert f"{plural}/valid created (server dry run)" in ok.stdout

    bad = dev_cluster.kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        "-",
        input=yaml.safe_dump(make("invalid", "two")),
        check=False,
    )
    assert bad.returncode != 0
    assert "replicas" in bad.stderr and "integer" in bad.stderr, bad.stderr

    listed = json.loads(dev_cluster.kubectl("get", crd.split(".")[0], "-n", namespace, "-o", "json").stdout)
    assert listed["items"] == []


def test_a_crd_the_api_server_refuses_is_named_in_the_error(dev_cluster):
    """install_crds applies through the cluster's own server-side apply: a CRD whose name is not
    <plural>.<group> is refused by the API server, and the error names it (nothing is created)."""
    bad = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.wrong.example"},
        "spec": {
            "group": "example.dev",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "scope": "Namespaced",
            "versions": [
                {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {"type": "object"}}}
            ],
        },
    }
    with pytest.raises(DevClusterError, match=r"CustomResourceDefinition widgets\.wrong\.example was rejected"):
        dev_cluster.install_crds([bad], timeout=10)
    gone = dev_cluster.kubectl("get", "crd", "widgets.wrong.example", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_kubectl_error_carries_stderr(dev_cluster):
    with pytest.raises(KubectlError, match=r"NotFound|not found"):
        dev_cluster.kubectl("get", "namespace", "does-not-exist-here")


def test_helm_talks_to_the_cluster(dev_cluster):
    out = dev_cluster.helm("list", "--all-namespaces", "-o", "json").stdout
    assert json.loads(out) == []


# --- the CLI daemonizes and cleans up -------------------------------------------------------


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            pids.append(int(d.name))
    return pids


@pytest.mark.slow
def test_cli_up_outlives_the_command_and_down_leaves_no_process(own_clusters, tmp_path):
    state = tmp_path / "cli-cluster"
    env = dict(os.environ)
    import llmtrain

    pkg_root = str(Path(llmtrain.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
    cli = [sys.executable, "-m", "llmtrain_devcluster"]
    recs: dict = {}
    try:
        # This test is about process lifecycle; the project CRD is covered by the dev_cluster fixture.
        up = subprocess.run(
            [*cli, "up", "--state-dir", str(state), "--no-project-crd"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert up.returncode == 0, up.stderr
        assert f"export KUBECONFIG={state / 'kubeconfig'}" in up.stdout

        recs = read_pids(state / "pids.json")
        assert set(recs) == {"etcd", "kube-apiserver", "kube-controller-manager"}
        # The `up` command has exited; its components are still serving.
        assert all(is_running(r) for r in recs.values())
        cluster = DevCluster(state)
        assert (
            cluster.kubectl("get", "namespace", "kube-system", "-o", "name").stdout.strip() == "namespace/kube-system"
        )

        st = subprocess.run(
            [*cli, "status", "--state-dir", str(state)], env=env, capture_output=True, text=True, timeout=60
        )
        assert st.returncode == 0 and "ready:      True" in st.stdout, st.stdout + st.stderr

        again = subprocess.run(
            [*cli, "up", "--state-dir", str(state), "--no-project-crd"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode == 0 and "already running" in again.stderr
        assert read_pids(state / "pids.json") == recs
    finally:
        down = subprocess.run(
            [*cli, "down", "--state-dir", str(state)], env=env, capture_output=True, text=True, timeout=120
        )
    assert down.returncode == 0, down.stderr
    assert recs, "up never recorded its pids"
    for name, rec in recs.items():
        assert not is_running(rec), f"{name} (pid {rec['pid']}) still running after down"
    assert _processes_mentioning(str(state)) == []
    st = subprocess.run(
        [*cli, "status", "--state-dir", str(state)], env=env, capture_output=True, text=True, timeout=60
    )
    assert st.returncode == 3

"""The real node (issue 42): a chain dev cluster with ``real_node=True`` runs real pods on this
machine, and its ``down`` leaves nothing behind.

One cluster for the module; its pods use the node's busybox image (Debian's busybox-static, built
by ``make tools``) and satisfy the restricted Pod Security profile. Every wait polls a condition.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from kubernetes import client

from llmtrain_devcluster import DevCluster
from llmtrain_devcluster.node import NODE_NAME, import_image, status
from llmtrain_devcluster.node.cgroups import hierarchies
from llmtrain_devcluster.node.oci_archive import Entry, read_index, write_archive
from llmtrain_devcluster.process import wait_until
from llmtrain_devcluster.tools import node_image
from plugins.needs import needs


def _wait(fn, what: str, timeout: float = 60.0):
    return wait_until(fn, timeout=timeout, what=what, on_fail=AssertionError)


@pytest.fixture(scope="module")
@needs("cluster")
def real_cluster(tmp_path_factory):
    # No kwok nodes: this module's pods only ever land on the real node.
    with DevCluster(tmp_path_factory.mktemp("real-node"), chain=True, nodes={}, real_node=True) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def core(real_cluster):
    with real_cluster.api_client() as api:
        yield client.CoreV1Api(api)


@pytest.fixture(scope="module")
def ns(core):
    name = f"rn-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    _wait(lambda: core.read_namespaced_service_account("default", name), f"default ServiceAccount in {name}")
    yield name
    core.delete_namespace(name)


def pod(name: str, command: str, **spec) -> dict:
    """A busybox pod for the real node, as locked down as the restricted profile asks."""
    container = {
        "name": "c",
        "image": read_index(node_image("busybox")).name,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", command],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        **spec.pop("container", {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {"llmtrain.dev/node-kind": "real"},
            "tolerations": [{"key": "llmtrain.dev/real-node", "operator": "Exists"}],
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container],
            **spec,
        },
    }


def phase(core, ns: str, name: str) -> client.V1Pod:
    return core.read_namespaced_pod(name, ns)


def running(core, ns: str, name: str) -> client.V1Pod:
    p = _wait(lambda: (q := phase(core, ns, name)).status.phase in ("Running", "Failed", "Succeeded") and q, name)
    assert p.status.phase == "Running", p.status
    return p


@pytest.fixture(scope="module")
def web_and_client(core, ns):
    """An httpd pod reachable as rank-0.job.<ns> (headless Service ``job``) and a client pod."""
    core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "job"},
            "spec": {"clusterIP": "None", "selector": {"app": "web"}, "publishNotReadyAddresses": True},
        },
    )
    core.create_namespaced_pod(
        ns,
        pod(
            "web",
            "echo hello-from-web > /tmp/index.html && exec httpd -f -p 8080 -h /tmp",
            hostname="rank-0",
            subdomain="job",
        ),
    )
    core.create_namespaced_pod(ns, pod("client", "echo client-started; exec sleep 3600"))
    return running(core, ns, "web"), running(core, ns, "client")


def kubectl_exec(cluster, ns: str, name: str, command: str) -> subprocess.CompletedProcess:
    return cluster.kubectl("exec", "-n", ns, name, "--", "sh", "-c", command, check=False)


@pytest.mark.slow(seconds=13)  # the module's chain cluster and node start in its setup
def test_node_is_ready_labelled_tainted_and_runs_the_pinned_kubelet_on_containerd(core):
    node = core.read_node(NODE_NAME)
    assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
    assert node.metadata.labels["llmtrain.dev/node-kind"] == "real"
    assert node.metadata.labels["node.kubernetes.io/instance-type"] == "cpu"
    assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [("llmtrain.dev/real-node", "true", "NoSchedule")]
    assert node.status.node_info.kubelet_version.startswith("v1.")
    assert node.status.node_info.container_runtime_version.startswith("containerd://1.")
    addresses = {a.type: a.address for a in node.status.addresses}
    assert addresses["InternalIP"].startswith("10.245.")


def test_a_locked_down_pod_runs_and_kubectl_logs_and_exec_reach_it(real_cluster, core, ns, web_and_client):
    _, client_pod = web_and_client
    assert client_pod.spec.node_name == NODE_NAME
    _wait(lambda: "client-started" in real_cluster.kubectl("logs", "-n", ns, "client").stdout, "client's log")
    r = kubectl_exec(real_cluster, ns, "client", "id -u; grep CapEff /proc/self/status; ip route")
    assert r.returncode == 0, r.stderr
    uid, capeff, *routes = r.stdout.splitlines()
    assert uid == "1000" and capeff.split() == ["CapEff:", "0000000000000000"]
    assert routes and not any(line.startswith("default") for line in routes)  # nothing off the node


def test_pods_reach_each_other_over_the_bridge_and_by_their_fqdn(real_cluster, ns, web_and_client):
    web, _ = web_and_client
    r = kubectl_exec(real_cluster, ns, "client", f"wget -qO- http://{web.status.pod_ip}:8080/")
    assert r.returncode == 0 and r.stdout.strip() == "hello-from-web", r.stderr
    fqdn = f"rank-0.job.{ns}.svc.cluster.local"
    r = kubectl_exec(real_cluster, ns, "client", f"nslookup {fqdn}; wget -qO- http://rank-0.job:8080/")
    assert r.returncode == 0, r.stdout + r.stderr
    assert web.status.pod_ip in r.stdout and r.stdout.rstrip().endswith("hello-from-web")
    r = kubectl_exec(real_cluster, ns, "web", "hostname -f")
    assert r.stdout.strip() == fqdn, r.stderr


def test_names_outside_the_cluster_are_nxdomain(real_cluster, ns, web_and_client):
    r = kubectl_exec(real_cluster, ns, "client", "nslookup example.com")
    assert r.returncode != 0 and "NXDOMAIN" in r.stdout, r.stdout + r.stderr


def test_the_kubelet_writes_the_termination_message(core, ns):
    core.create_namespaced_pod(
        ns, pod("done", 'printf \'{"result":"ok"}\' > /dev/termination-log', restartPolicy="Never")
    )
    p = _wait(lambda: (q := phase(core, ns, "done")).status.phase in ("Succeeded", "Failed") and q, "pod done")
    term = p.status.container_statuses[0].state.terminated
    assert (p.status.phase, term.reason, term.message) == ("Succeeded", "Completed", '{"result":"ok"}')


def test_a_memory_limited_hog_is_oom_killed(core, ns):
    limits = {"memory": "32Mi", "cpu": "500m"}
    core.create_namespaced_pod(
        ns,
        pod(
            "hog",
            "dd if=/dev/zero of=/dev/null bs=96M count=1",
            restartPolicy="Never",
            container={"resources": {"limits": limits, "requests": limits}},
        ),
    )
    p = _wait(lambda: (q := phase(core, ns, "hog")).status.phase in ("Succeeded", "Failed") and q, "pod hog")
    term = p.status.container_statuses[0].state.terminated
    assert (p.status.phase, term.reason, term.exit_code) == ("Failed", "OOMKilled", 137)


def test_import_image_skips_what_the_node_holds(real_cluster, tmp_path):
    assert import_image(real_cluster, node_image("busybox")) is False  # imported at up
    archive = tmp_path / "t.tar"
    write_archive(archive, f"llmtrain.local/import-test:{uuid.uuid4().hex[:8]}", [Entry("hello", b"hi\n", 0o644)])
    assert import_image(real_cluster, archive) is True
    assert import_image(real_cluster.state_dir, archive) is False


# --- two clusters at once, and what down leaves ------------------------------------------------------


def _host() -> dict:
    return {
        "iptables": subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout,
        "ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text(),
    }


def _links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def _mounts_under(path: Path) -> list[str]:
    return [m for m in Path("/proc/self/mountinfo").read_text().splitlines() if str(path) in m]


def _procs_mentioning(text: str) -> list[int]:
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if text.encode() in (p / "cmdline").read_bytes():
                    found.append(int(p.name))
            except OSError:
                pass
    return found


def _without_comments(iptables: str) -> str:
    return "\n".join(line for line in iptables.splitlines() if not line.startswith("#"))


@pytest.mark.slow(seconds=15)  # a second chain cluster with its node, up and down
def test_a_second_cluster_gets_its_own_node_and_its_down_leaves_nothing(
    real_cluster, core, ns, web_and_client, tmp_path
):
    first = status(real_cluster.state_dir)
    before = _host()
    second = DevCluster(tmp_path / "second", chain=True, nodes={}, real_node=True)
    try:
        second.up()
        other = status(second.state_dir)
        for key in ("slot", "bridge", "subnet", "ip", "cgroup_root", "socket", "dns", "kubelet"):
            assert other[key] != first[key], key
        with second.api_client() as api:
            core2 = client.CoreV1Api(api)
            core2.create_namespaced_pod("default", pod("hello", "echo hi; exec sleep 3600"))
            p = running(core2, "default", "hello")
        assert p.status.pod_ip.startswith(other["subnet"].rsplit(".", 2)[0])
        # The first cluster's pods still resolve and reach each other while both run.
        r = kubectl_exec(real_cluster, ns, "client", "wget -qO- http://rank-0.job:8080/")
        assert r.stdout.strip() == "hello-from-web", r.stderr
    finally:
        second.down()
    assert other["bridge"] not in _links()
    assert not _mounts_under(second.state_dir)
    assert not _procs_mentioning(str(second.state_dir))
    assert not [h for h in hierarchies() if (h / other["cgroup_root"].lstrip("/")).exists()]
    after = _host()
    assert after["ip_forward"] == before["ip_forward"]
    assert _without_comments(after["iptables"]) == _without_comments(before["iptables"])
    # and the first node is untouched
    assert first["bridge"] in _links()
    assert all(p["running"] for p in status(real_cluster.state_dir)["processes"].values())
    assert os.path.exists(first["socket"])

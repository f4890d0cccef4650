"""The real node's configuration, without starting it: what each file says and why (issue 42).
The node itself runs in test_real_node.py."""

from __future__ import annotations

import ipaddress
import json
import re
import tarfile
from pathlib import Path

import pytest
import yaml

from llmtrain_devcluster import __main__ as cli
from llmtrain_devcluster import chain, tools
from llmtrain_devcluster.node import containerd, coredns, kubelet, network
from llmtrain_devcluster.node.oci_archive import Entry, read_index, write_archive
from llmtrain_devcluster.node.slots import SLOTS, Slot

REPO = Path(__file__).resolve().parents[2]


def test_install_tools_and_tools_py_hash_the_same_key_files_coredns_included():
    m = re.search(r"^KEY_FILES=\(([^)]*)\)", (REPO / "scripts" / "install-tools.sh").read_text(), re.M)
    assert m, "KEY_FILES=(...) not found in install-tools.sh"
    assert tuple(m.group(1).split()) == tools._KEY_FILES
    assert {"coredns/pins.env", "coredns/go.mod", "coredns/go.sum"} <= set(tools._KEY_FILES)


def test_coredns_pin_matches_its_module():
    pins = (REPO / "tools" / "coredns" / "pins.env").read_text()
    (version,) = re.findall(r"^COREDNS_VERSION=(\S+)", pins, re.M)
    assert f"github.com/coredns/coredns {version}\n" in (REPO / "tools" / "coredns" / "go.mod").read_text()


def test_slots_never_overlap_kwok_or_the_service_range_or_each_other():
    kwok = ipaddress.ip_network(chain.POD_CIDR)
    services = ipaddress.ip_network("10.0.0.0/24")
    nets = [ipaddress.ip_network(Slot(i).subnet) for i in range(SLOTS)]
    assert len(set(nets)) == SLOTS
    assert not any(n.overlaps(kwok) or n.overlaps(services) for n in nets)
    assert len({Slot(i).bridge for i in range(SLOTS)}) == SLOTS and all(len(Slot(i).bridge) <= 15 for i in range(SLOTS))
    s = Slot(3)
    assert ipaddress.ip_address(s.ip) in ipaddress.ip_network(s.subnet)
    assert s.cgroup_root == "/llmtrain-3"


def test_cni_bridge_is_no_gateway_and_masquerades_nothing(tmp_path):
    conf = json.loads(network.cni_conflist(Slot(2), tmp_path / "ipam"))
    (bridge,) = conf["plugins"]
    assert bridge["bridge"] == "llmt2"
    assert (bridge["isGateway"], bridge["isDefaultGateway"], bridge["ipMasq"], bridge["hairpinMode"]) == (
        False,
        False,
        False,
        True,
    )
    (rng,) = bridge["ipam"]["ranges"][0]
    assert rng["subnet"] == "10.245.2.0/24" and rng["gateway"] == "10.245.2.1"
    assert "routes" not in bridge["ipam"]  # no default route in pods
    assert bridge["ipam"]["dataDir"] == str(tmp_path / "ipam")


def test_containerd_keeps_everything_in_its_dirs_and_clamps_oom_score_adj(tmp_path):
    p = containerd.ContainerdPaths(
        *(tmp_path / n for n in ("root", "state", "c.sock", "runc", "opt", "net.d", "cni-bin", "runc-bin"))
    )
    toml = containerd.config_toml(p, sandbox_image="llmtrain.local/pause:3.10.2")
    for line in (
        f'root = "{tmp_path / "root"}"',
        f'state = "{tmp_path / "state"}"',
        f'address = "{tmp_path / "c.sock"}"',
        "restrict_oom_score_adj = true",  # root here lacks CAP_SYS_RESOURCE
        "netns_mounts_under_state_dir = true",
        'sandbox_image = "llmtrain.local/pause:3.10.2"',
        f'Root = "{tmp_path / "runc"}"',
        "SystemdCgroup = false",
        f'conf_dir = "{tmp_path / "net.d"}"',
    ):
        assert line in toml, line
    with pytest.raises(ValueError, match="quotes"):
        containerd.config_toml(containerd.ContainerdPaths(*(Path('/a"b'),) * 8), sandbox_image="x:y")


def test_kubelet_config_works_around_this_machine_and_locks_itself_down(tmp_path):
    paths = kubelet.KubeletPaths(
        tmp_path, tmp_path / "root", tmp_path / "logs", tmp_path / "vp", tmp_path / "ca.crt", tmp_path / "c.sock"
    )
    cfg = yaml.safe_load(kubelet.config_yaml(paths, Slot(1), port=20250, healthz_port=20248))
    assert cfg["failCgroupV1"] is False and cfg["cgroupDriver"] == "cgroupfs" and cfg["cgroupRoot"] == "/llmtrain-1"
    assert cfg["address"] == "10.245.1.1" and cfg["clusterDNS"] == ["10.245.1.1"]
    assert cfg["clusterDomain"] == "cluster.local" and cfg["readOnlyPort"] == 0
    assert cfg["authentication"]["anonymous"] == {"enabled": False}
    assert cfg["authentication"]["x509"] == {"clientCAFile": str(tmp_path / "ca.crt")}
    assert cfg["authorization"] == {"mode": "Webhook"}
    assert cfg["evictionHard"] == {} and cfg["imageGCHighThresholdPercent"] == 100
    assert cfg["failSwapOn"] is False and cfg["makeIPTablesUtilChains"] is False
    assert cfg["registerWithTaints"] == [{"key": "llmtrain.dev/real-node", "value": "true", "effect": "NoSchedule"}]
    assert cfg["podLogsDir"] == str(tmp_path / "logs") and cfg["volumePluginDir"] == str(tmp_path / "vp")
    argv = kubelet.argv(Path("/k"), paths, name="real-node", ip="10.245.1.1")
    assert "--node-labels=llmtrain.dev/node-kind=real,node.kubernetes.io/instance-type=cpu" in argv


def test_the_real_node_is_the_catalogs_cpu_type_so_gpu_jobs_never_select_it():
    from llmtrain.catalog import instance_type

    assert not instance_type(kubelet.INSTANCE_TYPE).is_gpu


def test_corefile_serves_the_cluster_domain_on_the_bridge_and_nxdomain_for_the_rest(tmp_path):
    text = coredns.corefile(Slot(4), kubeconfig=tmp_path / "kc", ready_port=1234)
    assert text.startswith("cluster.local:53 4.245.10.in-addr.arpa:53 0.0.10.in-addr.arpa:53 {")
    assert text.count("bind 10.245.4.1") == 2 and "ready 127.0.0.1:1234" in text
    assert "pods insecure" in text and "forward" not in text  # no upstream
    assert "rcode NXDOMAIN" in text
    role, binding = coredns.rbac()
    assert {v for r in role["rules"] for v in r["verbs"]} == {"list", "watch"}
    assert {x for r in role["rules"] for x in r["resources"]} == {"services", "endpointslices", "namespaces", "pods"}
    assert binding["subjects"][0]["name"] == coredns.USER


def test_oci_archive_is_reproducible_and_names_its_image(tmp_path):
    entries = [Entry("bin", mode=0o755), Entry("bin/tool", b"#!/bin/sh\n"), Entry("bin/sh", link="tool")]
    a = write_archive(tmp_path / "a.tar", "llmtrain.local/t:1", entries, entrypoint=["/bin/tool"])
    b = write_archive(tmp_path / "b.tar", "llmtrain.local/t:1", entries, entrypoint=["/bin/tool"])
    assert a == b == read_index(tmp_path / "a.tar")
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    with tarfile.open(tmp_path / "a.tar") as t:
        names = t.getnames()
    assert names[:2] == ["oci-layout", "index.json"] and len(names) == 5
    with pytest.raises(ValueError, match="no tag"):
        write_archive(tmp_path / "c.tar", "llmtrain.local/t", entries)


def test_cli_refuses_a_real_node_without_the_chain(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["up", "--real-node", "--state-dir", "/nonexistent"])
    assert e.value.code == 2
    assert "--real-node needs --chain" in capsys.readouterr().err

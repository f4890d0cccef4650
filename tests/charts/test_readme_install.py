"""The documented Helm install and upgrade commands, run verbatim from a clean copy of the repository
(only what git tracks or would track: no `helm dependency build` output, no caches) against the
real dev cluster, with plain `helm` and `kubectl` on PATH.

The upgrade starts from a release whose CRD is older than the checked-in one (one field missing,
as after a release that added it) and checks that the README's upgrade path brings the CRD up to
date, which `helm upgrade` alone never does (Helm applies crds/ on install only).

The commands live in the docs site since issue 21 (docs/getting-started/install-eks.md, and
docs/operations/upgrading.md); the README's short install must use the same Helm line, so what a
reader copies from the README is what runs here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from chart_helpers import ROOT

pytestmark = [pytest.mark.infra, pytest.mark.slow]

README = ROOT / "README.md"
INSTALL_PAGE = ROOT / "docs" / "getting-started" / "install-eks.md"
UPGRADE_PAGE = ROOT / "docs" / "operations" / "upgrading.md"
CRD_FILE = Path("charts/llmtrain-operator/crds/llmtrain.dev_llmtrainingjobs.yaml")
NAMESPACE, RELEASE = "llmtrain-system", "llmtrain"  # what the README's commands use


def readme_commands(after: str, until: str | None = None, page: Path = README) -> list[str]:
    """Shell commands of the first ```bash block after the line containing `after` in `page`:
    continuation lines joined, comment lines dropped; from the marker `until` on (a comment line) nothing."""
    text = page.read_text()
    start = text.index(after)
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S).group(1)
    commands, current = [], ""
    for line in block.splitlines():
        if not current and line.lstrip().startswith("#"):
            if until and line.lstrip().startswith(until):
                break
            continue
        current += line
        if line.rstrip().endswith("\\"):
            current = current.rstrip()[:-1] + " "
            continue
        if current.strip():
            commands.append(current.strip())
        current = ""
    return commands


def install_commands() -> list[str]:
    cmds = readme_commands("# Install on EKS", page=INSTALL_PAGE)
    start = next(i for i, c in enumerate(cmds) if c.startswith("helm "))
    return [c for c in cmds[start:] if c.startswith(("helm ", "kubectl apply --server-side"))]


def test_readme_helm_install_is_the_tested_one():
    """Static: the README's own Helm line is one of the commands the cluster test below runs."""
    readme = [c.split("  #")[0].strip() for c in readme_commands("## Install on EKS") if c.startswith("helm ")]
    assert readme and all(c in install_commands() for c in readme), (readme, install_commands())


def clean_copy(dest: Path) -> Path:
    """The files a fresh clone of this tree would have (tracked, or untracked but not ignored)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "charts"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():  # deleted-but-not-yet-staged paths are listed too
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def shell(dev_cluster, tmp_path_factory):
    """Run a README line with bash, as a user would: helm and kubectl on PATH, the dev cluster's
    kubeconfig, helm's homes in a temp dir."""
    from llmtrain_devcluster.tools import find_tool

    home = tmp_path_factory.mktemp("helm-home")
    env = {**os.environ, "KUBECONFIG": str(dev_cluster.kubeconfig),
           "PATH": f"{find_tool('helm').parent}{os.pathsep}{find_tool('kubectl').parent}{os.pathsep}{os.environ['PATH']}",
           "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data")}

    def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
        r = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"README command failed in a clean copy: {command}\n{r.stdout}\n{r.stderr}"
        return r

    try:
        yield run
    finally:  # leave the session cluster with the project's CRD, whatever happened
        dev_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / CRD_FILE), check=False)
    subprocess.run(["bash", "-c", f"helm uninstall {RELEASE} -n {NAMESPACE}"], env=env, capture_output=True)
    dev_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def cluster_crd(dev_cluster) -> dict:
    return json.loads(dev_cluster.kubectl("get", "crd", "llmtrainingjobs.llmtrain.dev", "-o", "json").stdout)


def training_properties(crd: dict) -> dict:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "training"]["properties"]


def test_readme_install_then_crd_changing_upgrade_from_a_clean_copy(dev_cluster, shell, tmp_path):
    new = clean_copy(tmp_path / "new")
    # The previous release: same chart, but its CRD lacks spec.training.seed.
    old = clean_copy(tmp_path / "old")
    crd = yaml.safe_load((old / CRD_FILE).read_text())
    del training_properties(crd)["seed"]
    (old / CRD_FILE).write_text(yaml.safe_dump(crd, sort_keys=False))
    # The session cluster already holds the project's CRD (dev-cluster default); start from the old one.
    dev_cluster.kubectl("replace", "-f", str(old / CRD_FILE))

    commands = install_commands()
    assert any(c.startswith("helm lint --strict charts/llmtrain-operator") for c in commands)
    assert any(c.startswith(f"helm install {RELEASE} charts/llmtrain-operator -n {NAMESPACE}")
               and "etcd.enabled=true" in c for c in commands), commands
    for command in commands:
        shell(command, old)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in json.loads(dev_cluster.kubectl(
        "get", "deployment,statefulset,service", "-n", NAMESPACE, "-o", "json").stdout)["items"]}
    assert ("StatefulSet", "llmtrain-etcd") in kinds and ("Service", "llmtrain-etcd") in kinds
    assert ("Deployment", "llmtrain-llmtrain-operator") in kinds
    assert "seed" not in training_properties(cluster_crd(dev_cluster))

    # `helm upgrade` by itself leaves the CRD as it was: the reason the README's upgrade path exists.
    shell(f"helm upgrade {RELEASE} charts/llmtrain-operator -n {NAMESPACE} --reuse-values", new)
    assert "seed" not in training_properties(cluster_crd(dev_cluster))

    upgrade = readme_commands("## The operator chart", page=UPGRADE_PAGE)
    assert upgrade[0].startswith("kubectl apply --server-side") and upgrade[-1].startswith("helm upgrade")
    for command in upgrade:
        shell(command, new)
    assert training_properties(cluster_crd(dev_cluster)) == training_properties(
        yaml.safe_load((new / CRD_FILE).read_text()))
    # The API server now keeps the field instead of pruning it.
    job = {"apiVersion": "llmtrain.dev/v1alpha1", "kind": "LLMTrainingJob",
           "metadata": {"name": "after-upgrade", "namespace": NAMESPACE},
           "spec": {"model": {"preset": "tiny"}, "cluster": {"instanceType": "cpu"}, "training": {"seed": 7}}}
    dev_cluster.kubectl("create", "-f", "-", input=json.dumps(job))
    stored = json.loads(dev_cluster.kubectl("get", "llmtj", "after-upgrade", "-n", NAMESPACE, "-o", "json").stdout)
    assert stored["spec"]["training"]["seed"] == 7
    dev_cluster.kubectl("delete", "llmtj", "after-upgrade", "-n", NAMESPACE)

"""What the installed `llmtrain` package holds (issue 21): the operator and the trainer, not the local
test cluster (`devcluster/`), and nothing of the trainer imports the dev cluster at run time."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tracked_copy(dst: Path) -> Path:
    """The tracked files as the working tree has them. pip builds a local project in place, and
    setuptools leaves `llmtrain.egg-info` in the tree it builds: in the checkout, that stale copy of
    the metadata is what `importlib.metadata` finds first in any process started there."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, listed.decode().split("\0")):
        if (ROOT / rel).is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dst / rel)
    return dst


def _stamp(path: Path) -> float | None:
    return path.stat().st_mtime if path.exists() else None


@pytest.mark.slow
def test_the_wheel_holds_operator_and_trainer_but_not_devcluster(tmp_path):
    egg_info = ROOT / "llmtrain.egg-info"
    before = _stamp(egg_info)
    src = _tracked_copy(tmp_path / "src")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = tmp_path.glob("llmtrain-*.whl")
    tops = {n.split("/", 1)[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert {"llmtrain", "llmtrain_trainer"} <= tops
    assert "llmtrain_devcluster" not in tops, sorted(tops)
    assert _stamp(egg_info) == before, "the build wrote llmtrain.egg-info into the checkout"


def test_the_trainer_does_not_import_the_dev_cluster():
    offenders = []
    for f in sorted((ROOT / "trainer" / "llmtrain_trainer").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{f.name}: {n}" for n in names if n.split(".")[0] == "llmtrain_devcluster"]
    assert not offenders, offenders


def test_the_venv_still_imports_the_dev_cluster_for_tests():
    r = subprocess.run(
        [sys.executable, "-c", "import llmtrain_devcluster, sys; print(llmtrain_devcluster.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and str(ROOT / "devcluster") in r.stdout, r.stderr

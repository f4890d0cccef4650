"""Chart test helpers: a helm runner bound to a charts/ directory (helm's homes in a temp dir)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHARTS = ROOT / "charts"


@dataclass
class Helm:
    binary: Path
    home: Path
    charts: Path  # charts/ of the repository (or of a clean copy)

    @property
    def operator_chart(self) -> Path:
        return self.charts / "llmtrain-operator"

    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        env = dict(os.environ)
        for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"), ("HELM_DATA_HOME", "data")):
            env[var] = str(self.home / sub)
        if kubeconfig:
            env["KUBECONFIG"] = str(kubeconfig)
        return env

    def run(self, *args, check: bool = True, kubeconfig: Path | None = None, timeout: float = 180):
        r = subprocess.run([str(self.binary), *map(str, args)], capture_output=True, text=True,
                           env=self.env(kubeconfig), timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"helm {' '.join(map(str, args))} exited {r.returncode}\n"
                                 f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}")
        return r

    def template(self, *values_args, release: str = "llmtrain", namespace: str = "llmtrain-system",
                 check: bool = True):
        return self.run("template", release, self.operator_chart, "--namespace", namespace,
                        *values_args, check=check)

    def manifests(self, *values_args, **kw) -> list[dict]:
        return [d for d in yaml.safe_load_all(self.template(*values_args, **kw).stdout) if d]




def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict], kind: str) -> dict:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]

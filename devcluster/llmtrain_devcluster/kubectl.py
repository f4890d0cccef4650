"""The pinned kubectl and helm, run against a kubeconfig."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .tools import find_tool

__all__ = ["KubectlError", "run_helm", "run_kubectl"]


class KubectlError(subprocess.CalledProcessError):
    """kubectl (or helm) exited non-zero; ``str()`` includes its stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


def run_kubectl(
    kubeconfig: Path | str, *args: str, check: bool = True, input: str | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess:
    cmd = [str(find_tool("kubectl")), f"--kubeconfig={kubeconfig}", *map(str, args)]
    r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise KubectlError(r.returncode, cmd, r.stdout, r.stderr)
    return r


def run_helm(
    kubeconfig: Path | str, helm_home: Path, *args: str, check: bool = True, timeout: float = 300.0
) -> subprocess.CompletedProcess:
    """helm with its cache, config and data under ``helm_home`` (never the user's)."""
    env = dict(os.environ)
    env["KUBECONFIG"] = str(kubeconfig)
    for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"), ("HELM_DATA_HOME", "data")):
        env[var] = str(helm_home / sub)
    cmd = [str(find_tool("helm")), *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if check and r.returncode != 0:
        raise KubectlError(r.returncode, cmd, r.stdout, r.stderr)
    return r

"""CustomResourceDefinitions: the ones every dev cluster gets (Kubeflow's PyTorchJob, JobSet's
JobSet, the project's LLMTrainingJob) and installing any of them until the API server reports
Established."""

from __future__ import annotations

import importlib
import json
import ssl
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import yaml

from .process import http_get, wait_until
from .tools import jobset_crd_path, pytorchjob_crd_path

__all__ = ["default_crds", "install_crds", "load_crd", "project_crd_manifest"]


def load_crd(item: dict | Path | str) -> list[dict]:
    """The CRDs in ``item``: a manifest dict, or a YAML file (other kinds in it are skipped)."""
    if isinstance(item, dict):
        return [item]
    docs = [d for d in yaml.safe_load_all(Path(item).read_text()) if d]
    return [d for d in docs if d.get("kind") == "CustomResourceDefinition"]


def project_crd_manifest() -> dict | None:
    """``llmtrain.crd.crd_manifest()`` if that module exists yet, else None (with a note)."""
    try:
        mod = importlib.import_module("llmtrain.crd")
    except ModuleNotFoundError as e:
        if e.name not in ("llmtrain.crd", "llmtrain"):
            raise
        _note("llmtrain.crd is not importable yet: skipping the project's own CRD")
        return None
    fn = getattr(mod, "crd_manifest", None)
    if fn is None:
        _note("llmtrain.crd has no crd_manifest(): skipping the project's own CRD")
        return None
    return fn()


def default_crds(install_project_crd: bool) -> list[dict | Path]:
    # Both training backends' child kinds, in light mode too (objects, RBAC and validation only).
    crds: list[dict | Path] = [pytorchjob_crd_path(), jobset_crd_path()]
    if install_project_crd:
        manifest = project_crd_manifest()
        if manifest is not None:
            crds.append(manifest)
    return crds


def install_crds(
    crds: Iterable[dict | Path | str],
    *,
    apply: Callable[[Iterable[dict]], None],
    server: str,
    context: ssl.SSLContext,
    timeout: float = 60.0,
) -> list[str]:
    """Create or update each CRD with ``apply`` (the cluster's server-side apply, which names the
    CRD the API server rejected) and wait until it is Established (polled at ``server`` with the
    admin's TLS ``context``); return their names.

    Server-side apply: large CRDs (Kubeflow's is ~8k lines) don't fit client-side apply's
    last-applied annotation, and the API server does all validation.
    """
    docs = [d for item in crds for d in load_crd(item)]
    apply(docs)
    names = [doc["metadata"]["name"] for doc in docs]
    for name in names:
        url = f"{server}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"

        def established(url: str = url) -> bool:
            status, body = http_get(url, context=context)
            if status != 200:
                return False
            conds = (json.loads(body).get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

        wait_until(established, timeout=timeout, what=f"CRD {name} Established")
    return names


_noted: set[str] = set()


def _note(msg: str) -> None:
    if msg not in _noted:
        _noted.add(msg)
        print(f"llmtrain_devcluster: {msg}", file=sys.stderr)

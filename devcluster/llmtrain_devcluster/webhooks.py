"""Admission webhooks of a controller that runs on the host, really served: the module's own
``Mutating``/``ValidatingWebhookConfiguration`` manifests with the kustomize JSON patches its release
applies, each ``clientConfig`` turned from an in-cluster Service into the controller's loopback URL
with the dev cluster's CA as ``caBundle``; and the serving certificate that CA issues for it.

Used for JobSet (:mod:`.jobset`, chain mode) and Kubeflow Trainer v2 (:mod:`.trainer_v2`, the peer);
Kueue keeps its own filter (:func:`.kueue.webhook_configurations`: only the paths its configuration
serves).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from . import pki

__all__ = ["apply_json_patch", "module_webhook_configurations", "write_serving_cert"]


def apply_json_patch(doc: Any, ops: list[dict]) -> Any:
    """The ``add``/``replace``/``remove`` operations of an RFC 6902 patch (what kustomize's
    patches in these modules use), applied in place to ``doc``; returns ``doc``."""
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        kind = op["op"]
        if isinstance(parent, list):
            i = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(i, op["value"])
            elif kind == "replace":
                parent[i] = op["value"]
            elif kind == "remove":
                del parent[i]
            else:
                raise ValueError(f"JSON patch op {kind!r} at {op['path']} is not supported")
        elif kind in ("add", "replace"):
            if kind == "replace" and last not in parent:
                raise ValueError(f"JSON patch: replace of missing {op['path']}")
            parent[last] = op["value"]
        elif kind == "remove":
            del parent[last]
        else:
            raise ValueError(f"JSON patch op {kind!r} at {op['path']} is not supported")
    return doc


def module_webhook_configurations(
    root: Path, manifest: str, patches: Mapping[str, str], url: str, ca_pem: bytes
) -> list[dict]:
    """The webhook configurations in ``root / manifest`` with the release patches (``{kind: file
    under root}``) applied, each ``clientConfig`` the loopback ``url`` (+ the webhook's own path)
    and ``caBundle`` ``ca_pem``."""
    out = []
    for doc in yaml.safe_load_all((root / manifest).read_text()):
        if not doc:
            continue
        patch = patches.get(doc["kind"])
        if patch:
            apply_json_patch(doc, yaml.safe_load((root / patch).read_text()))
        for hook in doc["webhooks"]:
            service = hook["clientConfig"].pop("service")
            hook["clientConfig"] = {"url": url + service["path"], "caBundle": base64.b64encode(ca_pem).decode()}
        out.append(doc)
    return out


def write_serving_cert(ca: pki.CertificateAuthority, cert_dir: Path, name: str) -> Path:
    """``tls.crt``/``tls.key`` in ``cert_dir`` (controller-runtime's file names) for ``name`` on
    127.0.0.1/localhost, issued by the dev cluster's CA; returns ``cert_dir``."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    ca.issue_to_files(
        cert_dir / "tls.crt", cert_dir / "tls.key", name, server=True, dns=("localhost",), ips=("127.0.0.1",)
    )
    return cert_dir

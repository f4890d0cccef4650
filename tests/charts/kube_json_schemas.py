"""Kubernetes JSON schemas for kubeconform, generated from a real kube-apiserver's /openapi/v2.

kubeconform reads one JSON schema per kind, named `<kind>-<group's first label>-<version>.json`
(`deployment-apps-v1.json`, `pod-v1.json`, `llmtrainingjob-llmtrain-v1alpha1.json`), normally
from the kubernetes-json-schema repository, which our machines cannot reach. The dev cluster's
apiserver (Kubernetes 1.36, built from k8s.io/kubernetes) publishes the same definitions those files
are generated from, plus the schemas of every CRD installed in it, so we convert them here the way
openapi2jsonschema does:

- each definition carrying x-kubernetes-group-version-kind becomes a standalone schema holding the
  definitions it references;
- strict: every object with declared properties rejects unknown ones (a typo fails), unless
  x-kubernetes-preserve-unknown-fields says otherwise;
- IntOrString and Quantity (and x-kubernetes-int-or-string) accept a string or a number, as the
  apiserver does; `format` is dropped (the apiserver's formats are not JSON Schema's); OpenAPI's
  boolean exclusiveMinimum/Maximum become draft-07's numeric ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REF = "#/definitions/"
STRING_OR_NUMBER = {"oneOf": [{"type": "string"}, {"type": "number"}]}
STRING_OR_INTEGER = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
SPECIAL = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": STRING_OR_INTEGER,
    "io.k8s.apimachinery.pkg.api.resource.Quantity": STRING_OR_NUMBER,
}


def file_name(group: str, version: str, kind: str) -> str:
    """kubeconform's default name template: {{ .ResourceKind }}{{ .KindSuffix }}.json"""
    suffix = f"-{group.split('.')[0]}-{version}" if group else f"-{version}"
    return f"{kind.lower()}{suffix.lower()}.json"


def _convert(node: Any) -> Any:
    if isinstance(node, list):
        return [_convert(n) for n in node]
    if not isinstance(node, dict):
        return node
    if node.get("x-kubernetes-int-or-string"):
        return dict(STRING_OR_INTEGER)
    out = {k: _convert(v) for k, v in node.items() if k != "format" and not k.startswith("x-kubernetes-")}
    # OpenAPI's boolean exclusive bounds are draft-07 numbers.
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), bool):
            if node[bound] and plain in node:
                out[bound] = out.pop(plain)
            else:
                out.pop(bound)
    if "properties" in node:  # the property names themselves are not schemas
        out["properties"] = {k: _convert(v) for k, v in node["properties"].items()}
    if (node.get("type") == "object" or "properties" in node) and "properties" in node \
            and "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _refs(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(REF):
            found.add(ref[len(REF):])
        for v in node.values():
            _refs(v, found)
    elif isinstance(node, list):
        for v in node:
            _refs(v, found)


def _closure(defs: dict[str, Any], root: dict) -> dict[str, Any]:
    todo, seen = set(), set()
    _refs(root, todo)
    while todo:
        name = todo.pop()
        if name in seen or name not in defs:
            continue
        seen.add(name)
        _refs(defs[name], todo)
    return {n: defs[n] for n in sorted(seen)}


def generate(openapi_v2: dict, out_dir: Path) -> list[str]:
    """Write one strict JSON schema per kind into out_dir; returns the file names."""
    defs = {name: SPECIAL.get(name) or _convert(d) for name, d in openapi_v2["definitions"].items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, raw in openapi_v2["definitions"].items():
        for gvk in raw.get("x-kubernetes-group-version-kind", []):
            fname = file_name(gvk["group"], gvk["version"], gvk["kind"])
            schema = {"$schema": "http://json-schema.org/draft-07/schema#", **defs[name]}
            schema["definitions"] = _closure(defs, defs[name])
            (out_dir / fname).write_text(json.dumps(schema))
            written.append(fname)
    return written

"""The LLMTrainingJob CustomResourceDefinition, generated from the pydantic spec.

Pydantic's JSON Schema is close to the structural OpenAPI v3 schema Kubernetes wants, but not the
same: Kubernetes forbids `$ref`, `anyOf` with types, `title` and `const`, and wants every node
typed. `structural()` rewrites one into the other: refs are inlined, `X | None` becomes an optional
`X`, and pydantic's bounds/enums/defaults/descriptions carry over so the API server enforces them.
The chart's `crds/` file is generated from `crd_manifest()` and checked against it in tests.
"""

from __future__ import annotations

from typing import Any

from .spec import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION, LLMTrainingJobSpec
from .status import LLMTrainingJobStatus

_KEEP = (
    "type",
    "description",
    "default",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "maxProperties",
    "format",
    "x-kubernetes-int-or-string",  # an integer or a string, untyped (spec.checkpoint.intervalMinutes)
    "x-kubernetes-validations",
)


def structural(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rewrite one pydantic JSON Schema node (and its children) as a structural OpenAPI node."""
    defs = defs if defs is not None else schema.get("$defs", {})
    extra: dict[str, Any] = {
        k: schema[k] for k in ("description", "default", "x-kubernetes-validations") if k in schema
    }
    if "$ref" in schema:
        target = defs[schema["$ref"].split("/")[-1]]
        node: dict[str, Any] = structural(target, defs)
        return {**node, **extra}
    if "anyOf" in schema:  # Optional[X]: absent means "unset"; null itself is not accepted.
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express union {schema['anyOf']} structurally")
        node = structural(options[0], defs)
        merged = {**node, **{k: v for k, v in extra.items() if k != "default" or v is not None}}
        for key in ("enum", "format"):  # (a json_schema_extra of an optional field lands here)
            if key in schema:
                merged[key] = schema[key]
        return merged

    node = {k: schema[k] for k in _KEEP if k in schema}
    # JSON Schema's numeric exclusive bounds are OpenAPI 3.0 booleans beside minimum/maximum.
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if not isinstance(node.get(bound, True), bool):
            node[plain], node[bound] = node[bound], True
    if "type" not in node and "enum" in schema:
        node["type"] = "string"
    if node.get("type") == "object":
        props = schema.get("properties")
        if props is not None:
            node["properties"] = {name: structural(sub, defs) for name, sub in props.items()}
            if schema.get("required"):
                node["required"] = list(schema["required"])
        if isinstance(schema.get("additionalProperties"), dict):
            node["additionalProperties"] = structural(schema["additionalProperties"], defs)
    elif node.get("type") == "array":
        node["items"] = structural(schema["items"], defs)
    return node


def spec_schema() -> dict[str, Any]:
    raw = LLMTrainingJobSpec.model_json_schema(by_alias=True, mode="validation")
    node = structural(raw)
    # Sections with a default_factory have no JSON default; `{}` lets the API server fill in the
    # defaults inside them even when the user leaves the whole section out.
    for name, sub in node["properties"].items():
        if name not in node.get("required", []):
            sub.setdefault("default", {})
    return node


def status_schema() -> dict[str, Any]:
    """From `llmtrain.status.LLMTrainingJobStatus`: no free-form fields (kopf writes nothing here)."""
    raw = LLMTrainingJobStatus.model_json_schema(by_alias=True, mode="serialization")
    return structural(raw)


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    # status.model: the preset, or a dims summary (a jsonPath cannot fall back from one field to another)
    {"name": "Model", "type": "string", "jsonPath": ".status.model"},
    {"name": "Instance", "type": "string", "jsonPath": ".spec.cluster.instanceType"},
    {"name": "Nodes", "type": "integer", "jsonPath": ".spec.cluster.nodes"},
    {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempt"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    # why it is where it is: Queued (in Kueue's queue), Admitted, Preempted, a restart cause...
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss"},
    {"name": "Tokens/s", "type": "number", "jsonPath": ".status.progress.tokensPerSecond"},
    # shares as percentages: a column cannot format a number, so these are the display strings
    # written beside the ratios (llmtrain.status.percent says why)
    {"name": "MFU", "type": "string", "jsonPath": ".status.progress.mfuPercent"},
    {"name": "Goodput", "type": "string", "jsonPath": ".status.goodput.ratioPercent"},
    # when it will be done (controller/policy/progress.py's eta: recent step time, steps left, checkpoint
    # stall); removed when the job ends
    {"name": "ETA", "type": "string", "jsonPath": ".status.progress.estimatedCompletionTime"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd_manifest() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "listKind": f"{KIND}List",
                "categories": ["llmtrain"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "An LLM training run on EKS GPU nodes (or a local CPU cluster).",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                        }
                    },
                }
            ],
        },
    }

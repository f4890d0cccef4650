"""The LLMTrainingJob CustomResourceDefinition, generated from the pydantic spec.

Pydantic's JSON Schema is close to the structural OpenAPI v3 schema Kubernetes wants, but not the
same: Kubernetes forbids `$ref`, `anyOf` with types, `title` and `const`, and wants every node
typed. `structural()` rewrites one into the other: refs are inlined, `X | None` becomes an optional
`X`, and pydantic's bounds/enums/defaults/descriptions carry over so the API server enforces them.
The chart's `crds/` file is generated from `crd_manifest()` and checked against it in tests.
"""

from __future__ import annotations

from typing import Any

from .spec import (GROUP, KIND, PHASES, PLURAL, SHORT_NAMES, SINGULAR, VERSION,
                   LLMTrainingJobSpec)

_KEEP = ("type", "description", "default", "enum", "minimum", "maximum", "exclusiveMinimum",
         "exclusiveMaximum", "minLength", "maxLength", "pattern", "minItems", "maxItems", "maxProperties",
         "format", "x-kubernetes-validations")


def structural(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rewrite one pydantic JSON Schema node (and its children) as a structural OpenAPI node."""
    defs = defs if defs is not None else schema.get("$defs", {})
    extra = {k: schema[k] for k in ("description", "default", "x-kubernetes-validations")
             if k in schema}
    if "$ref" in schema:
        target = defs[schema["$ref"].split("/")[-1]]
        node = structural(target, defs)
        return {**node, **extra}
    if "anyOf" in schema:  # Optional[X]: absent means "unset"; null itself is not accepted.
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express union {schema['anyOf']} structurally")
        node = structural(options[0], defs)
        merged = {**node, **{k: v for k, v in extra.items() if k != "default" or v is not None}}
        if "enum" in schema:
            merged["enum"] = schema["enum"]
        return merged

    node: dict[str, Any] = {k: schema[k] for k in _KEEP if k in schema}
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
    number = {"type": "number"}
    return {
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": list(PHASES)},
            "message": {"type": "string"},
            "reason": {"type": "string"},
            "attempt": {"type": "integer"},
            "restarts": {"type": "integer"},
            "observedGeneration": {"type": "integer"},
            "pytorchJob": {"type": "string"},
            "rendezvousId": {"type": "string"},
            "startTime": {"type": "string", "format": "date-time"},
            "attemptStartTime": {"type": "string", "format": "date-time"},
            "attemptCreationTime": {"type": "string", "format": "date-time"},
            "nextAttemptTime": {"type": "string", "format": "date-time"},
            "model": {"type": "string"},
            "completionTime": {"type": "string", "format": "date-time"},
            "plan": {"type": "object", "properties": {
                "memoryPerGpuGiB": number, "fits": {"type": "boolean"},
                "flopsPerToken": number, "numParams": {"type": "integer"},
                "expectedTokensPerSecond": number}},
            "progress": {"type": "object", "properties": {
                "step": {"type": "integer"}, "loss": number, "tokensPerSecond": number,
                "mfu": number, "lastCheckpointStep": {"type": "integer"},
                "lastCheckpointTime": {"type": "string", "format": "date-time"},
                "heartbeatTime": {"type": "string", "format": "date-time"},
                "updateTime": {"type": "string", "format": "date-time"},
                # the trainer's per-step loss facts (controller/health.py)
                "nonFiniteLossSteps": {"type": "integer"}, "nonFiniteLossMaxSteps": {"type": "integer"},
                "nonFiniteLossFirstStep": {"type": "integer"}, "lossMedian": number,
                "lossSpikeStep": {"type": "integer"}, "lossSpikeRatio": number,
                "resumedBeforeStep": {"type": "integer"}}},
            # a NaN/spike rollback the next attempt still has to apply (controller/health.py)
            "resumeBeforeStep": {"type": "integer"},
            # failure forensics, preflight and flight recorder (controller/forensics.py)
            "badNodes": {"type": "array", "items": {"type": "object", "required": ["node", "reason"], "properties": {
                "node": {"type": "string"}, "reason": {"type": "string"}, "attempt": {"type": "integer"},
                "pod": {"type": "string"}, "exitCode": {"type": "integer"}, "xid": {"type": "integer"},
                "message": {"type": "string"}, "time": {"type": "string", "format": "date-time"}}}},
            "avoidNodes": {"type": "array", "items": {"type": "string"}},
            "preflight": {"type": "object", "properties": {
                "attempt": {"type": "integer"}, "healthy": {"type": "boolean"}, "degraded": {"type": "boolean"},
                "busBandwidthGBps": number, "expectedBusBandwidthGBps": number, "worldSize": {"type": "integer"},
                "suspectNodes": {"type": "array", "items": {"type": "string"}},
                "time": {"type": "string", "format": "date-time"}}},
            "preflightFailures": {"type": "integer"},
            "flightRecorder": {"type": "object", "properties": {
                "attempt": {"type": "integer"}, "reason": {"type": "string"}, "path": {"type": "string"},
                "persistent": {"type": "boolean"}, "note": {"type": "string"}}},
            "conditions": {"type": "array", "items": {
                "type": "object", "required": ["type", "status"],
                "properties": {
                    "type": {"type": "string"}, "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                    "reason": {"type": "string"}, "message": {"type": "string"},
                    "lastTransitionTime": {"type": "string", "format": "date-time"},
                    "observedGeneration": {"type": "integer"}}}},
        },
        # kopf keeps its own bookkeeping under status.kopf; let it.
        "x-kubernetes-preserve-unknown-fields": True,
    }


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    # status.model: the preset, or a dims summary (a jsonPath cannot fall back from one field to another)
    {"name": "Model", "type": "string", "jsonPath": ".status.model"},
    {"name": "Instance", "type": "string", "jsonPath": ".spec.cluster.instanceType"},
    {"name": "Nodes", "type": "integer", "jsonPath": ".spec.cluster.nodes"},
    {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempt"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss"},
    {"name": "Tokens/s", "type": "number", "jsonPath": ".status.progress.tokensPerSecond"},
    {"name": "MFU", "type": "number", "jsonPath": ".status.progress.mfu"},
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
            "names": {"kind": KIND, "plural": PLURAL, "singular": SINGULAR,
                      "shortNames": list(SHORT_NAMES), "listKind": f"{KIND}List",
                      "categories": ["llmtrain"]},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": {
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
                }},
            }],
        },
    }

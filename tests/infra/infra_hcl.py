"""python-hcl2 (8.x) output, normalised: keys and string literals without their HCL quotes,
`__is_block__` markers dropped, every *.tf of a directory merged into one view."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import hcl2

ROOT = Path(__file__).resolve().parents[2]
TF_DIR = ROOT / "terraform"
CATALOG = ROOT / "operator" / "llmtrain" / "data" / "instances.yaml"


def tool_env() -> dict[str, str]:
    env = dict(os.environ)
    # No user CLI config, no update check phoning home, no colour codes in the output we parse.
    env.update(TF_CLI_CONFIG_FILE=os.devnull, CHECKPOINT_DISABLE="1", TF_IN_AUTOMATION="1", NO_COLOR="1")
    return env


def _unquote(v: Any) -> Any:
    if isinstance(v, str) and len(v) >= 2 and v[0] == v[-1] == '"':
        return v[1:-1]
    return v


def clean(node: Any) -> Any:
    if isinstance(node, dict):
        return {_unquote(k): clean(v) for k, v in node.items() if k not in ("__is_block__", "__comments__")}
    if isinstance(node, list):
        return [clean(v) for v in node]
    return _unquote(node)


class Module:
    """resources[(type, name)] -> body; locals[name] -> expr; variables[name] -> body;
    modules[name] -> the module block's arguments."""

    def __init__(self, directory: Path):
        self.files = sorted(directory.glob("*.tf"))
        self.resources: dict[tuple[str, str], dict] = {}
        self.data: dict[tuple[str, str], dict] = {}
        self.locals: dict[str, Any] = {}
        self.variables: dict[str, dict] = {}
        self.outputs: dict[str, dict] = {}
        self.modules: dict[str, dict] = {}
        for f in self.files:
            with f.open() as fh:
                doc = clean(hcl2.load(fh))
            for section, target in (("resource", self.resources), ("data", self.data)):
                for entry in doc.get(section, []):
                    for rtype, named in entry.items():
                        for name, body in named.items():
                            assert (rtype, name) not in target, f"duplicate {rtype}.{name}"
                            target[(rtype, name)] = body
            for entry in doc.get("locals", []):
                self.locals.update(entry)
            for entry in doc.get("variable", []):
                self.variables.update(entry)
            for entry in doc.get("output", []):
                self.outputs.update(entry)
            for entry in doc.get("module", []):
                self.modules.update(entry)

    def of_type(self, rtype: str) -> dict[str, dict]:
        return {n: b for (t, n), b in self.resources.items() if t == rtype}


def block(body: dict, name: str) -> list[dict]:
    """The (possibly repeated) nested block `name` of a resource body."""
    v = body.get(name, [])
    return v if isinstance(v, list) else [v]


def dynamic(body: dict, name: str) -> dict | None:
    for d in body.get("dynamic", []):
        if name in d:
            return d[name]
    return None

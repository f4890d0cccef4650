#!/usr/bin/env python3
"""Write llmtrain's Grafana dashboards and alert rules where they are consumed.

  dashboards/dashboards.py            -> dashboards/generated/<uid>.json
                                      -> charts/llmtrain-operator/files/dashboards/<uid>.json
  dashboards/rules/llmtrain.rules.yaml -> charts/llmtrain-operator/files/rules/llmtrain.rules.yaml

The chart needs its own copies (Helm's .Files cannot read outside the chart directory).
`--check` writes nothing and exits 1 listing every out-of-date file (tests use the same code).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generated_files

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "llmtrain-operator"
RULES = ROOT / "dashboards" / "rules" / "llmtrain.rules.yaml"


def load_dashboards_module():
    spec = importlib.util.spec_from_file_location("llmtrain_dashboards", ROOT / "dashboards" / "dashboards.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def expected_files() -> dict[Path, bytes]:
    """Every generated file and its exact content."""
    mod = load_dashboards_module()
    out: dict[Path, bytes] = {}
    for uid, data in mod.build_all().items():
        text = mod.render(data).encode()
        out[ROOT / "dashboards" / "generated" / f"{uid}.json"] = text
        out[CHART / "files" / "dashboards" / f"{uid}.json"] = text
    out[CHART / "files" / "rules" / RULES.name] = RULES.read_bytes()
    return out


def stale_files() -> list[Path]:
    return generated_files.stale(expected_files())


def main(argv: list[str] | None = None) -> int:
    return generated_files.main(expected_files, "scripts/gen-dashboards.py", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())

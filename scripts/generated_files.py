"""Shared by the generators (gen-chart-crds.py, gen-dashboards.py): write generated files, or
with --check list the out-of-date ones and exit 1. Tests call `stale()` on the same expectations."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stale(expected: dict[Path, bytes]) -> list[Path]:
    return [p for p, data in expected.items() if not p.is_file() or p.read_bytes() != data]


def main(
    expected_files: Callable[[], dict[Path, bytes]], script: str, description: str, argv: list[str] | None = None
) -> int:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--check", action="store_true", help="only report out-of-date files")
    args = ap.parse_args(argv)
    expected = expected_files()
    if args.check:
        out_of_date = stale(expected)
        for p in out_of_date:
            print(f"out of date: {p.relative_to(ROOT)} (run {script})", file=sys.stderr)
        return 1 if out_of_date else 0
    for p, data in expected.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        if not p.is_file() or p.read_bytes() != data:
            p.write_bytes(data)
            print(f"wrote {p.relative_to(ROOT)}")
    return 0

"""Where and when a benchmark's result was measured: the fields every trainer benchmark's JSON
starts with (the command, the date, the machine, the commit, the load before and after)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def provenance(load_before: tuple[float, float, float]) -> dict:
    """`load_before`: os.getloadavg() when the benchmark started; the load after is read now."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False)
    return {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "commit": commit.stdout.strip(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }

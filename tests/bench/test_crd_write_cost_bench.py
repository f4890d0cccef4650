"""bench/crd_write_cost.py --quick: the real operator's two status writes are captured and replayed
on every kind, and the figures it reports exist for each (about 20 s: one light cluster)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_crd_write_cost_quick(own_clusters, tmp_path):
    out = tmp_path / "cost.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "crd_write_cost.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    copies = ["without CEL rules", "without defaults", "without a schema"]
    kinds = ["llmtrainingjob", *(f"llmtrainingjob {c}" for c in copies)]
    cost = result["api_server_and_etcd_cpu_ms_per_object"]
    # TrainJob only with `make peer-tools`; it says why not otherwise
    assert set(cost) - {"trainjob"} == set(kinds) and ("trainjob" in cost) != ("trainjob" in result)
    for kind in cost:
        assert len(cost[kind]["all"]) == 2 and cost[kind]["median"] > 0
    sizes = result["object_bytes"]
    # The CRD's defaults fill in what the bench's spec leaves out (fsdp.activationCheckpointing, ...):
    # the stored spec is larger with them, and without them it is the spec as written, as it is
    # without a schema.
    assert sizes["llmtrainingjob"]["spec"] > sizes["llmtrainingjob without defaults"]["spec"]
    assert sizes["llmtrainingjob without defaults"]["spec"] == sizes["llmtrainingjob without a schema"]["spec"]
    assert all(s["object"] > s["spec"] for s in sizes.values())

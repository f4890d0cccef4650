"""terraform/ checked by real tools: the pinned terraform (fmt, and `terraform console` evaluating
the catalog-derived locals and the variable validations, no providers or init needed) and checkov.
Cold, the first test builds terraform 1.5.7 from source (~2-3 min) and checkov's venv (~30 s)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from infra_hcl import CATALOG, ROOT, TF_DIR, tool_env

pytestmark = [pytest.mark.infra, pytest.mark.slow]

# Files that reference only variables and the catalog file: evaluable without providers.
EVAL_FILES = ("catalog.tf", "variables.tf")


def test_terraform_fmt(terraform_bin):
    proc = subprocess.run(
        [str(terraform_bin), "fmt", "-check", "-recursive", "-diff", "-no-color", str(TF_DIR)],
        capture_output=True,
        text=True,
        env=tool_env(),
        timeout=120,
    )
    assert proc.returncode == 0, f"terraform fmt would change:\n{proc.stdout}{proc.stderr}"


@pytest.fixture
def eval_dir(tmp_path) -> Path:
    """A copy of the provider-free files, laid out so ${path.module}/../operator/... is the catalog."""
    mod = tmp_path / "terraform"
    mod.mkdir()
    for name in EVAL_FILES:
        shutil.copy(TF_DIR / name, mod / name)
    cat = tmp_path / CATALOG.relative_to(ROOT)
    cat.parent.mkdir(parents=True)
    shutil.copy(CATALOG, cat)
    return mod


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def console(terraform_bin, eval_dir, expr: str, *args: str) -> tuple[int, str, str]:
    """(rc, stdout, stderr without colour codes). Note: `terraform console` reports invalid
    variables on stderr but may still exit 0, so callers look at stderr too."""
    proc = subprocess.run(
        [str(terraform_bin), "console", *args],
        input=expr + "\n",
        cwd=eval_dir,
        capture_output=True,
        text=True,
        env=tool_env(),
        timeout=120,
    )
    return proc.returncode, ANSI.sub("", proc.stdout), ANSI.sub("", proc.stderr)


def evaluate(terraform_bin, eval_dir, expr: str, *args: str):
    rc, out, err = console(terraform_bin, eval_dir, f"jsonencode({expr})", *args)
    assert rc == 0 and "Error" not in err, err
    return json.loads(json.loads(out))


def _gpu_types():
    inst = yaml.safe_load(CATALOG.read_text())["instances"]
    return {k: v for k, v in inst.items() if v["gpus_per_node"] > 0}


@pytest.mark.parametrize("efa_only", [True, False])
def test_launch_template_interfaces_equal_catalog_for_every_gpu_type(terraform_bin, eval_dir, efa_only):
    types = _gpu_types()
    groups = {f"g{i}": {"instance_type": t} for i, t in enumerate(sorted(types))}
    var = "gpu_node_groups=" + json.dumps(groups).replace('":', '"=')
    got = evaluate(
        terraform_bin,
        eval_dir,
        "{groups = local.gpu_groups, nics = local.efa_network_interfaces}",
        "-var",
        var,
        "-var",
        f"efa_only_secondary_interfaces={str(efa_only).lower()}",
    )
    for g, spec in groups.items():
        cat = types[spec["instance_type"]]
        nics = got["nics"][g]
        assert len(nics) == cat["efa_interfaces"], (spec, nics)
        assert got["groups"][g]["gpus_per_node"] == cat["gpus_per_node"]
        assert got["groups"][g]["known"] is True
        assert [n["network_card_index"] for n in nics] == list(range(cat["efa_interfaces"]))
        assert nics[0] == {"network_card_index": 0, "device_index": 0, "interface_type": "efa"}
        assert all(n["device_index"] == 1 for n in nics[1:])
        assert {n["interface_type"] for n in nics[1:]} == ({"efa-only"} if efa_only else {"efa"})


@pytest.mark.parametrize("tfvars", sorted((TF_DIR / "examples").glob("*.tfvars")), ids=lambda p: p.name)
def test_example_tfvars_pass_validation_and_size_efa_from_catalog(terraform_bin, eval_dir, tfvars):
    types = _gpu_types()
    got = evaluate(
        terraform_bin,
        eval_dir,
        "{groups = local.gpu_groups, nics = local.efa_network_interfaces}",
        f"-var-file={tfvars}",
    )
    assert got["groups"]
    for g, spec in got["groups"].items():
        assert spec["known"], g
        assert len(got["nics"][g]) == types[spec["instance_type"]]["efa_interfaces"]


def test_unknown_instance_type_is_flagged(terraform_bin, eval_dir):
    got = evaluate(
        terraform_bin, eval_dir, "local.gpu_groups", "-var", 'gpu_node_groups={x={instance_type="g5.48xlarge"}}'
    )
    assert got["x"]["known"] is False  # the launch template's precondition fails the plan on this


@pytest.mark.parametrize(
    "var, message",
    [
        ('gpu_node_groups={p5={instance_type="p5.48xlarge", max_size=500}}', "max_size"),
        ('gpu_node_groups={p5={instance_type="p5.48xlarge", min_size=3, desired_size=1}}', "min_size"),
        ('gpu_node_groups={p5={instance_type="p5.48xlarge", capacity_type="SPOT"}}', "capacity_type"),
        ('gpu_node_groups={p5={instance_type="p5.48xlarge", capacity_type="CAPACITY_BLOCK"}}', "CAPACITY_BLOCK needs"),
        ("gpu_node_groups={}", "at least one GPU node group"),
        ("system_node_group={min_size=0}", "system_node_group"),
        ('kubernetes_version="2.0"', "kubernetes_version"),
        ('endpoint_public_access_cidrs=["0.0.0.0/0"]', "not 0.0.0.0/0"),
        ("fsx_storage_capacity_gib=3000", "multiple of 2400"),
        ('cluster_name="LLM_train"', "cluster_name"),
    ],
)
def test_variable_validation_rejects(terraform_bin, eval_dir, var, message):
    _rc, out, err = console(terraform_bin, eval_dir, "local.gpu_groups", "-var", var)
    flat = " ".join(err.replace("│", " ").split())
    assert "Error: Invalid value for variable" in flat, f"{var} was accepted:\n{out}{err}"
    assert message in flat, err


def test_checkov_has_no_failing_checks(checkov_bin):
    proc = subprocess.run(
        [str(checkov_bin), "-d", str(TF_DIR), "--framework", "terraform", "-o", "json", "--skip-download"],
        capture_output=True,
        text=True,
        env=tool_env(),
        timeout=600,
    )
    report = json.loads(proc.stdout)
    reports = report if isinstance(report, list) else [report]
    results = {"passed_checks": [], "failed_checks": [], "skipped_checks": []}
    for r in reports:
        for k in results:
            results[k] += r["results"][k]
    failed = [
        f"{c['check_id']} {c['resource']} ({c['file_path']}): {c['check_name']}" for c in results["failed_checks"]
    ]
    assert not failed, "checkov failures:\n" + "\n".join(failed)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the scan really ran over the module
    passed = {c["check_id"] for c in results["passed_checks"]}
    assert len(results["passed_checks"]) > 100
    for must in (
        "CKV_AWS_58",  # EKS secrets encryption
        "CKV_AWS_37",  # control-plane logging
        "CKV_AWS_39",  # public endpoint off by default
        "CKV_AWS_79",  # IMDSv2 on launch templates
        "CKV2_AWS_6",  # bucket public access block
        "CKV_AWS_21",
    ):  # bucket versioning
        assert must in passed, f"{must} did not pass"
    for c in results["skipped_checks"]:
        assert len((c["check_result"].get("suppress_comment") or "").strip()) >= 40, (
            f"{c['check_id']} skipped without a reason"
        )

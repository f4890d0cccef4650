"""Static structure of terraform/ (python-hcl2): the properties a reviewer would otherwise have to
re-check by eye on every change."""

from __future__ import annotations

import re

import pytest
import yaml
from infra_hcl import CATALOG, ROOT, TF_DIR, Module, block, dynamic

pytestmark = pytest.mark.infra


@pytest.fixture(scope="module")
def mod() -> Module:
    return Module(TF_DIR)


@pytest.fixture(scope="module")
def catalog() -> dict:
    return yaml.safe_load(CATALOG.read_text())["instances"]


def _gpu_catalog(catalog):
    return {k: v for k, v in catalog.items() if v["gpus_per_node"] > 0 and v["efa_interfaces"] > 0}


def test_catalog_is_read_from_the_project_catalog(mod):
    path = mod.locals["catalog_path"].replace("${path.module}", str(TF_DIR))
    assert (TF_DIR / path.split(str(TF_DIR) + "/", 1)[1]).resolve() == CATALOG.resolve()
    assert mod.locals["catalog"] == "${yamldecode(file(local.catalog_path))}"
    # gpu_catalog filters the catalog itself; gpu_groups take their counts from it.
    assert "local.catalog.instances" in mod.locals["gpu_catalog"]
    groups = mod.locals["gpu_groups"]
    assert "local.gpu_catalog[g.instance_type].efa_interfaces" in groups
    assert "local.gpu_catalog[g.instance_type].gpus_per_node" in groups
    assert "range(g.efa_interfaces)" in mod.locals["efa_network_interfaces"]


def test_no_second_copy_of_the_catalog_numbers(catalog):
    """No EFA or GPU count written as a literal next to an instance type or in a range()."""
    counts = sorted({v["efa_interfaces"] for v in catalog.values() if v["efa_interfaces"]})
    for f in sorted(TF_DIR.glob("*.tf")):
        text = f.read_text()
        for n in counts:
            assert not re.search(rf"range\(\s*{n}\s*\)", text), f"{f.name}: range({n}) hard-codes an EFA count"
        assert not re.search(r"efa_interfaces\s*=\s*\d", text), f"{f.name}: literal efa_interfaces"
        assert not re.search(r"gpus_per_node\s*=\s*\d", text), f"{f.name}: literal gpus_per_node"
        for name in catalog:
            # an instance type name may appear in comments/descriptions, never as a map key with numbers
            assert not re.search(rf'"{re.escape(name)}"\s*=\s*\{{[^}}]*\d', text), (
                f"{f.name}: a table of numbers keyed by {name}"
            )


def test_gpu_launch_templates_declare_catalog_efa_interfaces_with_placement(mod):
    lts = mod.of_type("aws_launch_template")
    gpu_lts = {n: b for n, b in lts.items() if dynamic(b, "network_interfaces")}
    assert gpu_lts, "no launch template declares EFA network interfaces"
    for name, lt in gpu_lts.items():
        ni = dynamic(lt, "network_interfaces")
        assert ni["for_each"] == "${local.efa_network_interfaces[each.key]}", name
        content = ni["content"][0]
        for field in ("network_card_index", "device_index", "interface_type"):
            assert content[field] == f"${{network_interfaces.value.{field}}}", (name, field)
        assert "${aws_security_group.efa.id}" in content["security_groups"]
        # placement group of strategy "cluster"
        (placement,) = block(lt, "placement")
        m = re.fullmatch(r"\$\{aws_placement_group\.(\w+)\[each\.key\]\.name\}", placement["group_name"])
        assert m, f"launch template {name}: placement.group_name must reference a placement group"
        assert mod.resources[("aws_placement_group", m.group(1))]["strategy"] == "cluster"
        assert lt["for_each"] == mod.resources[("aws_placement_group", m.group(1))]["for_each"]
        # the instance type in the catalog is enforced at plan time
        conds = [p["condition"] for lc in block(lt, "lifecycle") for p in block(lc, "precondition")]
        assert "${each.value.known}" in conds
        # capacity reservation / capacity block targeting is available
        assert dynamic(lt, "capacity_reservation_specification") is not None
        assert dynamic(lt, "instance_market_options")["content"][0]["market_type"] == "capacity-block"
        # large, encrypted root volume
        (ebs,) = block(block(lt, "block_device_mappings")[0], "ebs")
        assert ebs["encrypted"] is True and ebs["volume_type"] == "gp3"


def test_every_gpu_node_group_has_placement_group_and_taint(mod):
    lts = mod.of_type("aws_launch_template")
    groups = mod.of_type("aws_eks_node_group")
    gpu = {n: g for n, g in groups.items() if "NVIDIA" in g.get("ami_type", "")}
    assert gpu, "no GPU node group"
    for name, g in gpu.items():
        (lt_ref,) = block(g, "launch_template")
        m = re.fullmatch(r"\$\{aws_launch_template\.(\w+)\[each\.key\]\.id\}", lt_ref["id"])
        assert m, f"GPU node group {name} must use its own launch template"
        lt = lts[m.group(1)]
        assert block(lt, "placement"), f"GPU node group {name}: launch template without placement group"
        assert dynamic(lt, "network_interfaces"), f"GPU node group {name}: launch template without EFA"
        assert g["for_each"] == lt["for_each"]
        taints = {(t["key"], t["value"], t["effect"]) for t in block(g, "taint")}
        assert ("nvidia.com/gpu", "true", "NO_SCHEDULE") in taints, name
        assert len(g["subnet_ids"]) == 1, f"{name}: one subnet (placement groups are zonal)"
        for label in ("nvidia.com/gpu.present", "vpc.amazonaws.com/efa.present", "llmtrain.dev/node-pool"):
            assert label in g["labels"], (name, label)
    # and the CPU group is not tainted (system pods must land there)
    cpu = {n: g for n, g in groups.items() if n not in gpu}
    assert cpu and all(not block(g, "taint") for g in cpu.values())


def test_renderer_tolerates_the_gpu_taint():
    from llmtrain import render

    keys = {(t["key"], t.get("effect")) for t in render.GPU_TOLERATIONS}
    assert ("nvidia.com/gpu", "NoSchedule") in keys
    # the renderer selects nodes by the kubelet's own instance-type label, which EKS sets
    assert render.INSTANCE_TYPE_LABEL == "node.kubernetes.io/instance-type"


def test_bucket_blocks_public_access_and_is_encrypted_versioned_with_lifecycle(mod):
    buckets = mod.of_type("aws_s3_bucket")
    assert buckets
    for name in buckets:
        ref = f"${{aws_s3_bucket.{name}.id}}"

        def one(rtype):
            found = [b for b in mod.of_type(rtype).values() if b.get("bucket") == ref]
            assert len(found) == 1, f"aws_s3_bucket.{name}: expected one {rtype}, found {len(found)}"
            return found[0]

        pab = one("aws_s3_bucket_public_access_block")
        for k in ("block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets"):
            assert pab[k] is True, (name, k)
        assert block(one("aws_s3_bucket_versioning"), "versioning_configuration")[0]["status"] == "Enabled"
        sse = one("aws_s3_bucket_server_side_encryption_configuration")
        assert block(block(sse, "rule")[0], "apply_server_side_encryption_by_default")[0]["sse_algorithm"] == "aws:kms"
        rules = block(one("aws_s3_bucket_lifecycle_configuration"), "rule")
        assert any(block(r, "noncurrent_version_expiration") for r in rules)
        assert any(block(r, "abort_incomplete_multipart_upload") for r in rules)
        assert "aws:SecureTransport" in one("aws_s3_bucket_policy")["policy"]
        assert block(one("aws_s3_bucket_ownership_controls"), "rule")[0]["object_ownership"] == "BucketOwnerEnforced"


def test_training_role_is_scoped_to_the_bucket(mod):
    # The S3 policy (per namespace, by the Pod Identity session tag) is evaluated in
    # test_training_bucket_policy; the trust policy in test_pod_identity_trust.
    pol = mod.resources[("aws_iam_role_policy", "training_bucket")]["policy"]
    assert pol == "${module.training_bucket_policy.json}"
    assert mod.modules["training_bucket_policy"]["bucket_arn"] == "${aws_s3_bucket.this.arn}"
    trust = mod.resources[("aws_iam_role", "training")]["assume_role_policy"]
    assert trust == '${module.pod_identity_trust["training"].json}'
    assoc = mod.resources[("aws_eks_pod_identity_association", "training")]
    assert assoc["service_account"] == "${local.pod_identity_service_accounts.training.service_account}"
    assert (
        mod.locals["pod_identity_service_accounts"]["training"]["service_account"] == "${var.training_service_account}"
    )


def test_cluster_hardening(mod):
    (cluster,) = mod.of_type("aws_eks_cluster").values()
    assert cluster["version"] == "${var.kubernetes_version}"
    assert re.fullmatch(r"1\.\d+", mod.variables["kubernetes_version"]["default"])
    assert set(cluster["enabled_cluster_log_types"]) == {
        "api",
        "audit",
        "authenticator",
        "controllerManager",
        "scheduler",
    }
    (vpc,) = block(cluster, "vpc_config")
    assert vpc["endpoint_private_access"] is True
    assert vpc["endpoint_public_access"] == "${var.endpoint_public_access}"
    assert mod.variables["endpoint_public_access"]["default"] is False
    (enc,) = block(cluster, "encryption_config")
    assert enc["resources"] == ["secrets"] and "aws_kms_key" in block(enc, "provider")[0]["key_arn"]


def test_fsx_and_helm_releases_present(mod):
    assert mod.of_type("aws_fsx_lustre_file_system")
    assert mod.of_type("kubernetes_persistent_volume_claim_v1")
    assert mod.of_type("kubernetes_storage_class_v1")
    releases = mod.of_type("helm_release")
    for name in ("nvidia_device_plugin", "efa_device_plugin", "llmtrain", "kube_prometheus_stack", "dcgm_exporter"):
        assert name in releases, name
    # third-party charts are pinned
    for name, r in releases.items():
        assert "version" in r or name == "llmtrain", f"helm_release.{name} without a pinned version"
    assert releases["llmtrain"]["chart"] == "${local.llmtrain_chart}"
    assert "../charts/llmtrain-operator" in mod.locals["llmtrain_chart"]
    # Kueue is optional and after the PyTorchJob CRD (its pytorchjob integration needs the CRD at start-up)
    assert releases["kueue"]["count"] == "${var.install_kueue ? 1 : 0}"
    assert mod.variables["install_kueue"]["default"] is False
    assert "${kustomization_resource.training_operator_p2}" in releases["kueue"]["depends_on"]
    # the monitoring stack is switchable
    for name in ("kube_prometheus_stack", "dcgm_exporter"):
        assert releases[name]["count"] == "${var.enable_monitoring ? 1 : 0}"


def test_chart_values_set_by_terraform_exist_in_the_chart(mod):
    """Keys terraform passes to the llmtrain-operator chart are keys its values.yaml defines."""
    chart_values = yaml.safe_load((TF_DIR.parent / "charts/llmtrain-operator/values.yaml").read_text())
    etcd_values = yaml.safe_load(
        (TF_DIR.parent / "charts/llmtrain-operator/charts/llmtrain-etcd/values.yaml").read_text()
    )
    base = mod.locals["llmtrain_base_values"]
    assert base
    for k, v in base.items():
        assert k in chart_values, f"terraform sets llmtrain chart value {k!r}, absent from values.yaml"
        if isinstance(v, dict):
            # etcd.* values go to the llmtrain-etcd subchart
            known = set(chart_values[k] or {}) | (set(etcd_values) if k == "etcd" else set())
            for sub in v:
                assert sub in known, f"terraform sets {k}.{sub}, absent from the chart's values"


def test_variables_are_documented_and_validated(mod):
    for name, v in mod.variables.items():
        assert len(v.get("description", "")) >= 20, f"variable {name}: no useful description"
    for name in (
        "gpu_node_groups",
        "system_node_group",
        "kubernetes_version",
        "region",
        "fsx_storage_capacity_gib",
        "endpoint_public_access_cidrs",
    ):
        assert block(mod.variables[name], "validation"), f"variable {name} has no validation"
    for name in ("cluster_name", "kubeconfig_command", "bucket_name", "fsx_claim_name", "training_role_arn"):
        assert name in mod.outputs, name


def test_checkov_skips_carry_a_justification():
    skips = []
    for f in sorted(TF_DIR.glob("*.tf")):
        for line in f.read_text().splitlines():
            if "checkov:skip" in line:
                m = re.search(r"#\s*checkov:skip=(CKV2?_[A-Z0-9]+_\d+):(.*)$", line)
                assert m, f"{f.name}: malformed skip: {line.strip()}"
                assert len(m.group(2).strip()) >= 40, f"{f.name}: {m.group(1)} skipped without a real reason"
                skips.append(m.group(1))
    assert len(skips) == len(set(skips)), "a check skipped twice"


@pytest.mark.parametrize("tfvars", sorted((TF_DIR / "examples").glob("*.tfvars")), ids=lambda p: p.name)
def test_example_tfvars_use_catalog_gpu_types(tfvars, catalog):
    import hcl2
    from infra_hcl import clean

    with tfvars.open() as fh:
        values = clean(hcl2.load(fh))
    groups = values["gpu_node_groups"]
    assert groups
    for name, g in groups.items():
        assert g["instance_type"] in _gpu_catalog(catalog), (tfvars.name, name)


def test_terraform_etcd_endpoint_is_the_operator_default(mod):
    from llmtrain.spec import DEFAULT_ETCD_ENDPOINT

    expr = mod.locals["etcd_endpoint"].replace("${local.llmtrain_namespace}", mod.locals["llmtrain_namespace"])
    assert expr == DEFAULT_ETCD_ENDPOINT


def test_default_eks_version_is_supported_and_the_upgrade_policy_is_explicit(mod):
    """Issue 10, defect 10: 1.33 left EKS standard support; the default is the Kubernetes minor
    llmtrain's manifests are validated against (the dev cluster's, tools/k8s/pins.env), and the
    end-of-support behaviour is chosen, not left to EKS's default (extended support, billed)."""
    pins = dict(
        line.split("=", 1)
        for line in (ROOT / "tools/k8s/pins.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    dev_minor = ".".join(pins["KUBERNETES_VERSION"].lstrip("v").split(".")[:2])
    assert mod.variables["kubernetes_version"]["default"] == dev_minor
    assert tuple(map(int, dev_minor.split("."))) >= (1, 35)
    (cluster,) = mod.of_type("aws_eks_cluster").values()
    (policy,) = block(cluster, "upgrade_policy")
    assert policy["support_type"] == "${var.support_type}"
    assert mod.variables["support_type"]["default"] == "STANDARD"


def test_container_insights_addon_is_optional_with_its_own_identity(mod):
    addon = mod.resources[("aws_eks_addon", "cloudwatch_observability")]
    assert addon["addon_name"] == "amazon-cloudwatch-observability"
    assert addon["count"] == "${var.enable_container_insights ? 1 : 0}"
    assert mod.variables["enable_container_insights"]["default"] is False
    (assoc,) = block(addon, "pod_identity_association")
    assert assoc["service_account"] == "${local.pod_identity_service_accounts.cloudwatch_agent.service_account}"
    assert mod.locals["pod_identity_service_accounts"]["cloudwatch_agent"]["service_account"] == "cloudwatch-agent"
    attach = mod.resources[("aws_iam_role_policy_attachment", "cloudwatch_agent")]
    assert attach["policy_arn"].endswith("policy/CloudWatchAgentServerPolicy")

"""EKS Pod Identity roles: one trust policy definition (terraform/modules/pod-identity-trust), used
by every role an association hands to pods, with the confused-deputy condition aws:SourceAccount
and the Pod Identity session tags that pin the role to its cluster, namespace and ServiceAccount."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from infra_hcl import TF_DIR, Module, block, tool_env

pytestmark = pytest.mark.infra

TRUST_MODULE = TF_DIR / "modules" / "pod-identity-trust"
ROLE_ARN = re.compile(r"\$\{aws_iam_role\.(\w+)(?:\[0\])?\.arn\}")
TRUST_REF = re.compile(r'\$\{module\.pod_identity_trust\["(\w+)"\]\.json\}')
LOCAL_REF = re.compile(r"\$\{local\.pod_identity_service_accounts\.(\w+)\.(namespaces|service_account)\}")
# Where the EKS add-ons put the ServiceAccount their association names (Amazon EKS User Guide:
# the FSx CSI driver's controller runs in kube-system; the CloudWatch observability add-on in
# amazon-cloudwatch). Pod Identity tags the session with this namespace.
ADDON_NAMESPACE = {"aws-fsx-csi-driver": "kube-system", "amazon-cloudwatch-observability": "amazon-cloudwatch"}


@pytest.fixture(scope="module")
def mod() -> Module:
    return Module(TF_DIR)


# The namespaces an association's `namespace` expression takes, as expressions of the same
# variables the trust's `namespaces` list is built from (local.training_namespaces below).
NAMESPACE_EXPR = {
    ("${var.training_namespace}", None): ["var.training_namespace"],
    ("${each.value}", "${toset(var.tenant_namespaces)}"): ["var.tenant_namespaces"],
}


def _associations(mod):
    """(role, namespace expression, service_account, where) of every Pod Identity association;
    `namespace` is a list of the variables it stands for, or a literal namespace."""
    found = []
    for name, a in mod.of_type("aws_eks_pod_identity_association").items():
        ns = NAMESPACE_EXPR.get((a["namespace"], a.get("for_each")), [a["namespace"]])
        found.append(
            (
                ROLE_ARN.fullmatch(a["role_arn"]).group(1),
                ns,
                a["service_account"],
                f"aws_eks_pod_identity_association.{name}",
            )
        )
    for name, addon in mod.of_type("aws_eks_addon").items():
        for a in block(addon, "pod_identity_association"):
            found.append(
                (
                    ROLE_ARN.fullmatch(a["role_arn"]).group(1),
                    [ADDON_NAMESPACE[addon["addon_name"]]],
                    a["service_account"],
                    f"aws_eks_addon.{name}",
                )
            )
    return found


def _pod_identity_roles(mod) -> set[str]:
    """Roles handed to pods by an association, and any role whose trust names Pod Identity."""
    roles = {role for role, *_ in _associations(mod)}
    for name, r in mod.of_type("aws_iam_role").items():
        if "pods.eks.amazonaws.com" in r["assume_role_policy"] or TRUST_REF.fullmatch(r["assume_role_policy"]):
            roles.add(name)
    return roles


def test_every_pod_identity_role_takes_the_one_trust_policy(mod):
    roles = _pod_identity_roles(mod)
    assert {"training", "fsx_csi", "cloudwatch_agent"} <= roles, roles
    problems = []
    for role in sorted(roles):
        trust = mod.resources[("aws_iam_role", role)]["assume_role_policy"]
        if not TRUST_REF.fullmatch(trust):
            lacks = [k for k in ("aws:SourceAccount", "aws:RequestTag/eks-cluster-arn") if k not in trust]
            problems.append(
                f"aws_iam_role.{role}: its own trust policy, not module.pod_identity_trust"
                + (f" (and it lacks {', '.join(lacks)})" if lacks else "")
            )
    assert not problems, "\n".join(problems)

    trust_mod = mod.modules["pod_identity_trust"]
    assert trust_mod["source"] == "./modules/pod-identity-trust"
    assert trust_mod["cluster_arn"] == "${aws_eks_cluster.this.arn}"
    assert trust_mod["for_each"] == "${local.pod_identity_service_accounts}"
    assert trust_mod["namespaces"] == "${each.value.namespaces}"
    assert trust_mod["service_account"] == "${each.value.service_account}"


def _trusted_namespaces(mod, expr) -> list[str]:
    """The trust's `namespaces` as the variables (or literals) they come from."""
    if expr == "${local.training_namespaces}":
        assert (
            mod.locals["training_namespaces"] == "${distinct(concat([var.training_namespace], var.tenant_namespaces))}"
        )
        return ["var.training_namespace", "var.tenant_namespaces"]
    return expr


def test_each_role_trusts_exactly_the_service_account_its_association_names(mod):
    """The session tags in the trust must be the association's namespace and ServiceAccount, else
    EKS hands out a role that STS then refuses to assume."""
    accounts = mod.locals["pod_identity_service_accounts"]
    checked = 0
    for role, namespaces, service_account, where in _associations(mod):
        key = TRUST_REF.fullmatch(mod.resources[("aws_iam_role", role)]["assume_role_policy"]).group(1)
        assert key in accounts, f"{where}: module.pod_identity_trust[{key!r}] has no entry in the local"

        def resolve(expr: str) -> str:
            m = LOCAL_REF.fullmatch(expr)
            return accounts[m.group(1)][m.group(2)] if m else expr

        assert resolve(service_account) == accounts[key]["service_account"], where
        trusted = _trusted_namespaces(mod, accounts[key]["namespaces"])
        assert set(namespaces) <= set(trusted), f"{where}: namespace {namespaces} not in the trust's {trusted}"
        checked += 1
    assert checked >= 4  # training, tenant, and the two add-ons


# ---- the module itself, evaluated by the pinned terraform ------------------------------------

CLUSTER = "arn:aws:eks:us-east-2:111122223333:cluster/llmtrain"


@pytest.fixture
def trust_dir(tmp_path):
    d = tmp_path / "pod-identity-trust"
    shutil.copytree(TRUST_MODULE, d)
    return d


def _policy(terraform_bin, trust_dir, cluster_arn=CLUSTER, namespaces=("llmtrain-jobs",), sa="llmtrain-trainer"):
    proc = subprocess.run(
        [
            str(terraform_bin),
            "console",
            "-var",
            f"cluster_arn={cluster_arn}",
            "-var",
            f"namespaces={json.dumps(list(namespaces))}",
            "-var",
            f"service_account={sa}",
        ],
        input="jsonencode(local.policy)\n",
        cwd=trust_dir,
        capture_output=True,
        text=True,
        env=tool_env(),
        timeout=120,
    )
    return proc.returncode, proc.stdout, re.sub(r"\x1b\[[0-9;]*m", "", proc.stderr)


@pytest.mark.slow
def test_trust_policy_document(terraform_bin, trust_dir):
    rc, out, err = _policy(terraform_bin, trust_dir)
    assert rc == 0 and "Error" not in err, err
    (stmt,) = json.loads(json.loads(out))["Statement"]
    assert stmt["Effect"] == "Allow"
    assert stmt["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert sorted(stmt["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    assert stmt["Condition"] == {
        "StringEquals": {
            "aws:SourceAccount": "111122223333",
            "aws:RequestTag/eks-cluster-arn": CLUSTER,
            "aws:RequestTag/kubernetes-namespace": ["llmtrain-jobs"],
            "aws:RequestTag/kubernetes-service-account": "llmtrain-trainer",
        },
    }


@pytest.mark.slow
def test_trust_policy_follows_the_cluster_partition(terraform_bin, trust_dir):
    rc, out, err = _policy(
        terraform_bin, trust_dir, cluster_arn="arn:aws-us-gov:eks:us-gov-west-1:210987654321:cluster/c1"
    )
    assert rc == 0 and "Error" not in err, err
    cond = json.loads(json.loads(out))["Statement"][0]["Condition"]
    assert cond["StringEquals"]["aws:SourceAccount"] == "210987654321"
    assert (
        cond["StringEquals"]["aws:RequestTag/eks-cluster-arn"]
        == "arn:aws-us-gov:eks:us-gov-west-1:210987654321:cluster/c1"
    )


@pytest.mark.slow
def test_trust_module_rejects_an_arn_that_is_not_a_cluster(terraform_bin, trust_dir):
    _rc, out, err = _policy(terraform_bin, trust_dir, cluster_arn="arn:aws:iam::111122223333:role/llmtrain")
    flat = " ".join(err.replace("│", " ").split())
    assert "Invalid value for variable" in flat and "cluster_arn must be an EKS cluster ARN" in flat, out + err


@pytest.mark.slow
def test_one_trust_for_every_training_namespace(terraform_bin, trust_dir):
    """The training role serves training_namespace and every tenant namespace (its S3 rights are
    scoped per namespace by the session tag, test_training_bucket_policy): StringEquals with a list
    matches any one of them, and only them."""
    rc, out, err = _policy(terraform_bin, trust_dir, namespaces=("llmtrain-jobs", "team-a", "team-b"))
    assert rc == 0 and "Error" not in err, err
    cond = json.loads(json.loads(out))["Statement"][0]["Condition"]["StringEquals"]
    assert cond["aws:RequestTag/kubernetes-namespace"] == ["llmtrain-jobs", "team-a", "team-b"]
    assert cond["aws:RequestTag/kubernetes-service-account"] == "llmtrain-trainer"

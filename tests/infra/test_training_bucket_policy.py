"""The training role's S3 permissions are scoped per namespace (issue: every job of every namespace
had read/write on the whole bucket, so any tenant could write the checkpoint another tenant's job
resumes from). terraform/modules/training-bucket-policy is evaluated by the pinned terraform, and
the document is checked request by request with a small evaluator of IAM's Allow rules for the
parts it uses (action and resource globs, `${aws:PrincipalTag/...}` variables, StringLike and
StringEquals conditions; anything else counts as not granting)."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess

import pytest
from infra_hcl import TF_DIR, Module, tool_env

pytestmark = pytest.mark.infra

POLICY_MODULE = TF_DIR / "modules" / "training-bucket-policy"
BUCKET = "arn:aws:s3:::llmtrain-111122223333-us-east-2"
KMS = "arn:aws:kms:us-east-2:111122223333:key/0000"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _evaluate(terraform_bin, tmp_path, shared=("datasets/", "tokens/"), checkpoint_prefix="checkpoints/") -> dict:
    d = tmp_path / "training-bucket-policy"
    shutil.copytree(POLICY_MODULE, d)
    args = [
        "-var",
        f"bucket_arn={BUCKET}",
        "-var",
        f"kms_key_arn={KMS}",
        "-var",
        "region=us-east-2",
        "-var",
        f"checkpoint_prefix={checkpoint_prefix}",
        "-var",
        f"shared_read_prefixes={json.dumps(list(shared))}",
    ]
    proc = subprocess.run(
        [str(terraform_bin), "console", *args],
        input="jsonencode(local.policy)\n",
        cwd=d,
        check=False,
        capture_output=True,
        text=True,
        env=tool_env(),
        timeout=120,
    )
    err = ANSI.sub("", proc.stderr)
    assert proc.returncode == 0 and "Error" not in err, err
    return json.loads(json.loads(proc.stdout))


def _as_list(v) -> list:
    return v if isinstance(v, list) else [v]


def _subst(pattern: str, tags: dict) -> str | None:
    """IAM policy variables: ${aws:PrincipalTag/K} → the session's tag value; an absent tag makes
    the pattern match nothing (None)."""
    out = pattern
    for m in re.finditer(r"\$\{aws:PrincipalTag/([^}]+)\}", pattern):
        if m.group(1) not in tags:
            return None
        out = out.replace(m.group(0), tags[m.group(1)])
    return None if "${" in out else out


def _glob(value: str, patterns, tags) -> bool:
    # IAM globs: * any run of characters (also '/'), ? one character; no other specials here.
    return any((p := _subst(pat, tags)) is not None and fnmatch.fnmatchcase(value, p) for pat in _as_list(patterns))


def allowed(policy: dict, action: str, resource: str, tags: dict, context: dict | None = None) -> bool:
    context = context or {}
    for st in policy["Statement"]:
        if st["Effect"] != "Allow" or not _glob(action, st["Action"], {}) or not _glob(resource, st["Resource"], tags):
            continue
        ok = True
        for op, conds in st.get("Condition", {}).items():
            for key, want in conds.items():
                if key not in context:
                    ok = False  # IAM: a condition on a key the request lacks does not match
                elif op == "StringLike":
                    ok &= _glob(context[key], want, tags)
                elif op == "StringEquals":
                    ok &= any(context[key] == _subst(w, tags) for w in _as_list(want))
                else:
                    ok = False
        if ok:
            return True
    return False


def obj(key: str) -> str:
    return f"{BUCKET}/{key}"


@pytest.fixture(scope="module")
def policy(terraform_bin, tmp_path_factory):
    """One evaluation for the module's tests (they only read it): each test ran terraform once."""
    return _evaluate(terraform_bin, tmp_path_factory.mktemp("policy"))


TEAM_A = {"kubernetes-namespace": "team-a", "kubernetes-service-account": "llmtrain-trainer"}


@pytest.mark.slow
@pytest.mark.parametrize("action", ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"])
def test_a_namespace_reaches_its_own_checkpoints(policy, action):
    assert allowed(policy, action, obj("checkpoints/team-a/llama/step-0000001000/a0/.metadata"), TEAM_A)
    assert allowed(policy, action, obj("checkpoints/team-a/llama/.write-test-7"), TEAM_A)  # the writability probe


@pytest.mark.slow
@pytest.mark.parametrize(
    "action",
    ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
)
@pytest.mark.parametrize(
    "key",
    [
        "checkpoints/team-b/llama/step-0000001000/a0/.metadata",  # another tenant
        "checkpoints/team-ab/x",  # a namespace whose name extends ours
        "checkpoints/team-a",  # not under our directory
        "checkpoints/x",
        "other/team-a/x",
        "team-a/x",
    ],
)
def test_a_namespace_cannot_touch_another_namespaces_objects(policy, action, key):
    assert not allowed(policy, action, obj(key), TEAM_A), f"team-a may {action} {key}"


@pytest.mark.slow
def test_shared_prefixes_are_read_only(policy):
    for key in ("datasets/c4/index.json", "tokens/llama2/shard-00000.bin"):
        assert allowed(policy, "s3:GetObject", obj(key), TEAM_A)
        for action in ("s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"):
            assert not allowed(policy, action, obj(key), TEAM_A), f"{action} {key}"


@pytest.mark.slow
def test_listing_only_under_own_and_shared_prefixes(policy):
    def lists(prefix):
        return allowed(policy, "s3:ListBucket", BUCKET, TEAM_A, {"s3:prefix": prefix})

    assert lists("checkpoints/team-a/llama/") and lists("checkpoints/team-a/") and lists("datasets/c4/")
    assert not lists("checkpoints/team-b/llama/") and not lists("checkpoints/") and not lists("")
    assert not allowed(policy, "s3:ListBucket", BUCKET, TEAM_A)  # no prefix: the whole bucket
    assert allowed(policy, "s3:GetBucketLocation", BUCKET, TEAM_A)


@pytest.mark.slow
def test_without_the_namespace_tag_nothing_per_namespace_is_granted(policy):
    """An association with session tags disabled: the variable does not resolve, the own-prefix
    statements grant nothing (only the shared reads remain)."""
    assert not allowed(policy, "s3:PutObject", obj("checkpoints/team-a/x"), {})
    assert not allowed(policy, "s3:GetObject", obj("checkpoints/team-a/x"), {})


@pytest.mark.slow
def test_no_wildcard_action_or_whole_bucket_resource(policy):
    for st in policy["Statement"]:
        assert not any(a in ("*", "s3:*") for a in _as_list(st["Action"])), st
        assert not any(r in ("*", f"{BUCKET}/*") for r in _as_list(st["Resource"])), st
    kms = [st for st in policy["Statement"] if any(a.startswith("kms:") for a in _as_list(st["Action"]))]
    assert len(kms) == 1 and kms[0]["Resource"] == KMS
    assert kms[0]["Condition"] == {"StringEquals": {"kms:ViaService": "s3.us-east-2.amazonaws.com"}}


@pytest.mark.slow
def test_no_shared_prefixes_means_no_shared_statement(terraform_bin, tmp_path):
    policy = _evaluate(terraform_bin, tmp_path, shared=())
    assert not allowed(policy, "s3:GetObject", obj("datasets/c4/index.json"), TEAM_A)
    assert allowed(policy, "s3:PutObject", obj("checkpoints/team-a/x"), TEAM_A)


# ---- the root module wires it for every training namespace --------------------------------------


@pytest.fixture(scope="module")
def mod() -> Module:
    return Module(TF_DIR)


def test_the_training_role_takes_the_namespace_scoped_policy(mod):
    pol = mod.resources[("aws_iam_role_policy", "training_bucket")]
    assert pol["role"] == "${aws_iam_role.training.id}"
    assert pol["policy"] == "${module.training_bucket_policy.json}", (
        "the training role's S3 policy is not the scoped one"
    )
    m = mod.modules["training_bucket_policy"]
    assert m["source"] == "./modules/training-bucket-policy"
    assert m["bucket_arn"] == "${aws_s3_bucket.this.arn}" and m["kms_key_arn"] == "${aws_kms_key.this.arn}"
    assert m["checkpoint_prefix"] == "${var.checkpoint_prefix}"
    assert m["shared_read_prefixes"] == "${var.shared_read_prefixes}"
    # no other policy gives the role anything in S3
    others = [
        n
        for (t, n), b in mod.resources.items()
        if t in ("aws_iam_role_policy", "aws_iam_role_policy_attachment")
        and n != "training_bucket"
        and "aws_iam_role.training." in json.dumps(b)
    ]
    assert not others, others


def test_every_tenant_namespace_gets_the_trainer_service_account_and_the_operator_watch(mod):
    assoc = mod.resources[("aws_eks_pod_identity_association", "tenant")]
    assert assoc["for_each"] == "${toset(var.tenant_namespaces)}" and assoc["namespace"] == "${each.value}"
    assert assoc["role_arn"] == "${aws_iam_role.training.arn}"
    sa = mod.resources[("kubernetes_service_account_v1", "tenant_trainer")]
    assert sa["for_each"] == "${kubernetes_namespace_v1.tenant}"
    (meta,) = sa["metadata"]
    assert meta["name"] == "${var.training_service_account}" and sa["automount_service_account_token"] is False
    assert mod.locals["llmtrain_base_values"]["watchNamespaces"] == "${local.training_namespaces}"
    assert mod.outputs["checkpoint_uri"]["value"].endswith("/${var.checkpoint_prefix}${var.training_namespace}/")

"""llmtrain-operator chart, without a cluster: lint, render, CRDs from their one source, RBAC,
hardening, Argo CD safety and the schema's rejections."""

from __future__ import annotations

import importlib.util
import itertools
import json
import re

import pytest
import yaml

from chart_helpers import CHARTS, ROOT, by_kind, one

pytestmark = pytest.mark.infra

ALL_ON = CHARTS / "llmtrain-operator" / "ci" / "all-on-values.yaml"
NAMESPACED = CHARTS / "llmtrain-operator" / "ci" / "namespaced-values.yaml"

# The operator's whole API surface, from the table next to its code (llmtrain/controller/rbac.py,
# itself checked against the code's API calls in test_operator_rbac.py); anything more in the chart
# is a least-privilege violation, anything less a 403 at run time.
from llmtrain.controller import rbac  # noqa: E402

# jobNetworkPolicy.enabled is on by default: the job's NetworkPolicy; backends.enabled is [pytorchjob]
EXPECTED_RULES = {
    k: set(v)
    for k, v in {**rbac.JOB_RULES, **rbac.BACKEND_RULES["pytorchjob"], **rbac.JOB_NETWORK_POLICY_RULES}.items()
}
# and with the bundled etcd (auth on by default) the attempts' rendezvous Secrets
ETCD_AUTH_RULES = {k: set(v) for k, v in rbac.RENDEZVOUS_AUTH_RULES.items()}
FRAMEWORK_RULES = {k: set(v) for k, v in rbac.CLUSTER_RULES.items()}
NODE_TAINT_VERBS = set(rbac.CLUSTER_RULES[("", "nodes")] | rbac.SUSPECT_TAINT_RULES[("", "nodes")])
LEASE_RULES = [{"apiGroups": [g], "resources": [r], "verbs": sorted(v)}
               for (g, r), v in {**rbac.LEADER_ELECTION_RULES, **rbac.RELIABILITY_RULES}.items()]


def operator_role(docs: list[dict]) -> dict:
    """The operator's own ClusterRole (not the aggregated user roles)."""
    roles = [d for d in by_kind(docs, "ClusterRole")
             if not any(k.startswith("rbac.authorization.k8s.io/aggregate-to") for k in d["metadata"]["labels"])]
    assert len(roles) == 1, [r["metadata"]["name"] for r in roles]
    return roles[0]


def _rules(role: dict) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                out.setdefault((g, r), set()).update(rule["verbs"])
    return out


def test_helm_lint_strict_default_and_everything_on(helm):
    for args in ([], ["-f", ALL_ON], ["-f", NAMESPACED]):
        r = helm.run("lint", "--strict", helm.operator_chart, *args)
        assert "1 chart(s) linted, 0 chart(s) failed" in r.stdout, r.stdout
    r = helm.run("lint", "--strict", helm.operator_chart / "charts" / "llmtrain-etcd")
    assert "0 chart(s) failed" in r.stdout


def test_default_render_is_minimal(helm):
    docs = helm.manifests()
    kinds = sorted(d["kind"] for d in docs)
    # Nothing a cluster usually already has: no monitoring objects, no etcd.
    # The operator's ClusterRole + the two user roles aggregated into view/edit/admin; the Role +
    # RoleBinding are only for the operator's own objects (its Lease and reliability ConfigMap), in
    # the release namespace.
    # The tenant-isolation admission policies (job references, job env, the operator's PyTorchJobs
    # and other objects, baseline-efa pods, llmtrain-labelled PyTorchJobs), each with its binding.
    assert kinds == ["ClusterRole"] * 3 + ["ClusterRoleBinding", "Deployment", "NetworkPolicy", "Role",
                                           "RoleBinding", "Service", "ServiceAccount"] + \
        ["ValidatingAdmissionPolicy"] * 6 + ["ValidatingAdmissionPolicyBinding"] * 6
    for d in docs:
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                             "ValidatingAdmissionPolicyBinding"):
            assert d["metadata"]["namespace"] == "llmtrain-system", d["kind"]
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(a.startswith("--peering") for a in args)
    assert one(docs, "Deployment")["spec"]["replicas"] == 1


def test_everything_on_renders_every_optional_part(helm):
    docs = helm.manifests("-f", ALL_ON)
    kinds = {d["kind"] for d in docs}
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap", "PodDisruptionBudget",
            "StatefulSet"} <= kinds
    dep = one(docs, "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    # Two replicas share the Lease (--leader-elect); kopf's peering is gone.
    assert "--leader-elect" in args and not any(a.startswith("--peering") for a in args)
    # The bundled etcd's Service is the default rendezvous endpoint.
    etcd_svc = [s for s in by_kind(docs, "Service") if "etcd" in s["metadata"]["name"]]
    assert [s["metadata"]["name"] for s in etcd_svc] == ["llmtrain-etcd"]
    assert "--default-etcd-endpoint=llmtrain-etcd.llmtrain-system.svc:2379" in args
    sts = one(docs, "StatefulSet")
    assert "--enable-v2=true" in sts["spec"]["template"]["spec"]["containers"][0]["args"]
    assert _rules(operator_role(docs)) == {**EXPECTED_RULES, **FRAMEWORK_RULES, **ETCD_AUTH_RULES}
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"].endswith("@sha256:" + "0123456789abcdef" * 4)


def test_namespaced_mode_uses_roles(helm):
    docs = helm.manifests("-f", NAMESPACED)
    # Only kopf's CRD observation stays cluster-wide.
    assert _rules(operator_role(docs)) == FRAMEWORK_RULES
    assert one(docs, "ClusterRoleBinding")["roleRef"]["name"] == operator_role(docs)["metadata"]["name"]
    roles = [r for r in by_kind(docs, "Role") if not r["metadata"]["name"].endswith("-leader-election")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert _rules(role) == EXPECTED_RULES
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"--namespace=team-a", "--namespace=team-b", "--default-etcd-endpoint=etcd.shared.svc:2379"} <= set(args)


def test_suspect_node_taint_is_off_by_default_and_adds_only_node_patch(helm):
    default = helm.manifests()
    args = one(default, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(a.startswith("--suspect-taint-fraction") for a in args)
    assert "patch" not in _rules(operator_role(default))[("", "nodes")]
    on = helm.manifests("--set-json", 'suspectNodeTaint={"enabled": true, "maxFraction": 0.25}')
    args = one(on, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--suspect-taint-fraction=0.25" in args
    # the per-namespace cap and the expiry have defaults (issue 18: a tenant cannot fence off nodes)
    assert {"--suspect-taint-max-per-namespace=2", "--suspect-taint-ttl-hours=24"} <= set(args)
    tuned = helm.manifests("--set-json", 'suspectNodeTaint={"enabled": true, "maxPerNamespace": 1, "ttlHours": 6}')
    args = one(tuned, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"--suspect-taint-max-per-namespace=1", "--suspect-taint-ttl-hours=6"} <= set(args)
    assert _rules(operator_role(on)) == {**EXPECTED_RULES, **FRAMEWORK_RULES, ("", "nodes"): NODE_TAINT_VERBS}


def test_rbac_is_exactly_least_privilege(helm):
    role = operator_role(helm.manifests())
    rules = _rules(role)
    assert rules == {**EXPECTED_RULES, **FRAMEWORK_RULES}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
    assert not any(r in ("secrets", "configmaps") for (_, r) in rules)
    binding = one(helm.manifests(), "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"] != "cluster-admin"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llmtrain-llmtrain-operator",
                                    "namespace": "llmtrain-system"}]


def test_deployment_is_hardened_and_probes_kopf_health(helm):
    dep = one(helm.manifests(), "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc.get("privileged")
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    health = next(p for p in c["ports"] if p["name"] == "health")["containerPort"]
    assert health == 8080 and "--liveness-port=8080" in c["args"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe
    assert c["command"] == ["llmtrain-operator"]
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "POD_ID" not in env  # kopf's peer identity: no peering any more


def test_replicas_elect_a_leader_on_a_lease_they_may_update(helm):
    docs = [d for d in yaml.safe_load_all(helm.template("--set", "replicaCount=2").stdout) if d]
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    assert "--leader-elect" in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    roles = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-leader-election")]
    assert roles and roles[0]["metadata"]["namespace"] == "llmtrain-system"
    assert [{**r, "verbs": sorted(r["verbs"])} for r in roles[0]["rules"]] == LEASE_RULES


def test_crds_are_generated_from_the_one_source():
    from llmtrain.crd import crd_manifest

    spec = importlib.util.spec_from_file_location("gen_chart_crds", ROOT / "scripts" / "gen-chart-crds.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.stale_files() == [], "run scripts/gen-chart-crds.py"
    checked_in = yaml.safe_load((CHARTS / "llmtrain-operator" / "crds" / "llmtrain.dev_llmtrainingjobs.yaml").read_text())
    assert checked_in == crd_manifest()
    names = {yaml.safe_load(f.read_text())["metadata"]["name"]
             for f in (CHARTS / "llmtrain-operator" / "crds").glob("*.yaml")}
    assert names == {"llmtrainingjobs.llmtrain.dev"}  # kopf's peering CRDs are gone (docs/operations/upgrading.md)


def test_monitoring_objects_carry_the_tested_rules_and_dashboards(helm):
    docs = helm.manifests("-f", ALL_ON)
    rule = one(docs, "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load((ROOT / "dashboards" / "rules" / "llmtrain.rules.yaml").read_text())["groups"]
    cms = {k: json.loads(v) for cm in by_kind(docs, "ConfigMap") if "grafana_dashboard" in cm["metadata"]["labels"]
           for k, v in cm["data"].items()}
    generated = {f.name: json.loads(f.read_text()) for f in (ROOT / "dashboards" / "generated").glob("*.json")}
    assert cms == generated and len(cms) == 3
    sm = one(docs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    pm = one(docs, "PodMonitor")
    assert pm["spec"]["selector"]["matchExpressions"] == [{"key": "llmtrain.dev/job", "operator": "Exists"}]
    # The Service the ServiceMonitor selects exists and exposes the named port.
    svc = next(s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics"))
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["name"] == sm["spec"]["endpoints"][0]["port"]


def test_argocd_safe_no_lookup_no_randomness_stable_output(helm):
    """Argo CD renders with `helm template`: lookup returns nothing there and anything random or
    time-based makes every sync a diff."""
    forbidden = re.compile(r"\b(lookup|randAlpha|randAlphaNum|randNumeric|randAscii|randBytes|uuidv4|now|"
                           r"genCA|genPrivateKey|genSelfSignedCert|genSignedCert|date|unixEpoch)\b")
    for tpl in CHARTS.glob("**/templates/*"):
        text = tpl.read_text()
        assert not forbidden.search(text), f"{tpl.relative_to(ROOT)}: {forbidden.search(text).group(0)}"
    first = helm.template("-f", ALL_ON).stdout
    assert first == helm.template("-f", ALL_ON).stdout
    # CRDs live in crds/ (applied before templates by Helm, first by Argo CD), not in templates/.
    assert not any(d["kind"] == "CustomResourceDefinition" for d in yaml.safe_load_all(first) if d)


# Each wrong value and the words helm's schema error must contain, so a user can tell what to fix.
WRONG_VALUES = [
    (["--set", "replicaCount=two"], ["replicaCount", "Invalid type", "Expected: integer"]),
    (["--set", "replicaCount=0"], ["replicaCount", "greater than or equal to 1"]),
    (["--set", "image.pullPolicy=Sometimes"], ["image.pullPolicy", "must be one of", "IfNotPresent"]),
    (["--set", "watchNamespaces[0]=Team_A"], ["watchNamespaces.0", "Does not match pattern"]),
    (["--set", "operator.metricsPort=70000"], ["operator.metricsPort", "less than or equal to 65535"]),
    (["--set", "serviceMonitor.interval=30 seconds"], ["serviceMonitor.interval", "Does not match pattern"]),
    (["--set", "defaultEtcdEndpoint=etcd-without-port"], ["defaultEtcdEndpoint", "Does not match pattern"]),
    (["--set", "replicas=2"], ["Additional property replicas is not allowed"]),
    (["--set", "logLevel=verbose"], ["logLevel", "must be one of", "info", "debug"]),
    (["--set", "backends.default=trainjob"], ["backends.default", "must be one of", "pytorchjob", "jobset"]),
    (["--set-json", "backends.enabled=[]"], ["backends.enabled", "Array must have at least 1 items"]),
    (["--set-json", 'backends.namespaceDefaults={"team-a": "mpijob"}'], ["team-a", "must be one of"]),
    (["--set", "etcd.enabled=true", "--set", "etcd.persistence.size=lots"], ["persistence.size", "Does not match pattern"]),
]


@pytest.mark.parametrize("args,words", WRONG_VALUES, ids=[" ".join(a[1::2]) for a, _ in WRONG_VALUES])
def test_schema_rejects_wrong_values_clearly(helm, args, words):
    r = helm.template(*args, check=False)
    assert r.returncode != 0, f"accepted {args}"
    assert "values don't meet the specifications of the schema" in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, f"{w!r} not in: {r.stderr}"


def _args(docs) -> list[str]:
    return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]


def _policies(docs) -> set[str]:
    return {p["metadata"]["name"].rsplit(".", 1)[-1] for p in by_kind(docs, "ValidatingAdmissionPolicy")}


def test_backends_reach_the_operator_and_its_rbac_and_admission_policies_follow_them(helm):
    """backends.enabled: the kinds the operator watches and creates (--backend), exactly their
    RBAC (rbac.BACKEND_RULES) and one operator-objects policy per kind; the default and the
    per-namespace defaults become flags; a default that is not enabled fails the render."""
    default = helm.manifests()
    assert {"--backend=pytorchjob", "--default-backend=pytorchjob"} <= set(_args(default))
    assert not any(a.startswith(("--backend=jobset", "--namespace-backend")) for a in _args(default))
    assert {"operator-pytorchjobs"} <= _policies(default) and "operator-jobsets" not in _policies(default)
    # the EFA exception reaches JobSet's pods (and its guards on JobSets and Jobs) only with jobset
    jobset_efa = {"llmtrain-jobsets", "llmtrain-jobs"}
    assert not jobset_efa & _policies(default)
    assert (("jobset.x-k8s.io", "jobsets") not in _rules(operator_role(default))
            and ("batch", "jobs") not in _rules(operator_role(default)))

    both = helm.manifests("--set", "backends.enabled={pytorchjob,jobset}", "--set", "backends.default=jobset",
                          "--set-json", 'backends.namespaceDefaults={"team-a": "pytorchjob"}')
    args = _args(both)
    assert {"--backend=pytorchjob", "--backend=jobset", "--default-backend=jobset",
            "--namespace-backend=team-a=pytorchjob"} <= set(args)
    assert {"operator-pytorchjobs", "operator-jobsets", *jobset_efa} <= _policies(both)
    want = {**EXPECTED_RULES, **FRAMEWORK_RULES, **{k: set(v) for k, v in rbac.BACKEND_RULES["jobset"].items()}}
    assert _rules(operator_role(both)) == want

    only_jobset = helm.manifests("--set", "backends.enabled={jobset}", "--set", "backends.default=jobset")
    assert ("kubeflow.org", "pytorchjobs") not in _rules(operator_role(only_jobset))
    assert "operator-pytorchjobs" not in _policies(only_jobset) and "operator-jobsets" in _policies(only_jobset)

    for bad in (["--set", "backends.default=jobset"],
                ["--set-json", 'backends.namespaceDefaults={"team-a": "jobset"}']):
        r = helm.template(*bad, check=False)
        assert r.returncode != 0 and "is not in backends.enabled" in r.stderr, (bad, r.stderr)


@pytest.mark.parametrize(
    "enabled",
    [c for n in range(1, len(rbac.BACKEND_RULES) + 1) for c in itertools.combinations(rbac.BACKEND_RULES, n)],
    ids="+".join,
)
def test_the_rbac_of_every_set_of_backends_is_exactly_theirs(helm, enabled):
    """The chart's rules for the backends come from files/backends.json (generated from the
    registry): for every set of enabled backends, the role is the base rules and exactly the union
    of theirs, where two need the same resource (jobset and job: batch Jobs) merged."""
    docs = helm.manifests("--set", f"backends.enabled={{{','.join(enabled)}}}", "--set", f"backends.default={enabled[0]}")
    want = {**EXPECTED_RULES}
    for backend in rbac.BACKEND_RULES["pytorchjob"]:
        del want[backend]
    for name in enabled:
        for key, verbs in rbac.BACKEND_RULES[name].items():
            want[key] = set(want.get(key, set())) | set(verbs)
    assert _rules(operator_role(docs)) == {**want, **FRAMEWORK_RULES}


def test_the_charts_backends_file_is_the_registrys():
    """files/backends.json is generated (scripts/gen-chart-crds.py), and the schema offers exactly
    the registry's backends wherever it names one."""
    from llmtrain.spec import BACKENDS

    doc = json.loads((CHARTS / "llmtrain-operator" / "files" / "backends.json").read_text())
    assert tuple(doc) == BACKENDS
    schema = json.loads((CHARTS / "llmtrain-operator" / "values.schema.json").read_text())
    props = schema["properties"]["backends"]["properties"]
    enums = [props["enabled"]["items"]["enum"], props["default"]["enum"], props["namespaceDefaults"]["additionalProperties"]["enum"]]
    assert enums == [list(BACKENDS)] * 3


def test_the_job_backends_admission_policies_hold_its_jobs_and_services(helm):
    """backends.enabled has job: the operator's Jobs are held to what the renderer makes, its
    Services to the Jobs' headless ones, and (admission policies' EFA exception) the Jobs whose pods
    carry llmtrain's label to the operator's and, with jobset, the JobSet controller's."""
    only_job = helm.manifests("--set", "backends.enabled={job}", "--set", "backends.default=job")
    assert {"operator-jobs", "llmtrain-jobs"} <= _policies(only_job)
    assert not {"operator-pytorchjobs", "operator-jobsets", "llmtrain-jobsets"} & _policies(only_job)
    objects = next(p for p in by_kind(only_job, "ValidatingAdmissionPolicy") if p["metadata"]["name"].endswith("operator-objects"))
    assert {"services"} <= {r for rule in objects["spec"]["matchConstraints"]["resourceRules"] for r in rule["resources"]}
    jobs_rule = next(p for p in by_kind(only_job, "ValidatingAdmissionPolicy") if p["metadata"]["name"].endswith(".llmtrain-jobs"))
    (check,) = jobs_rule["spec"]["validations"]
    assert "LLMTrainingJob" in check["expression"] and "JobSet" not in check["expression"]
    assert "the llmtrain operator" in check["message"] and "JobSet controller" not in check["message"]
    both = helm.manifests("--set", "backends.enabled={jobset,job}", "--set", "backends.default=job")
    jobs_rule = next(p for p in by_kind(both, "ValidatingAdmissionPolicy") if p["metadata"]["name"].endswith(".llmtrain-jobs"))
    (check,) = jobs_rule["spec"]["validations"]
    assert "LLMTrainingJob" in check["expression"] and "JobSet" in check["expression"]
    # without the job backend, the EFA exception still needs a JobSet's label on a Job's pod
    efa = next(p for p in by_kind(helm.manifests("--set", "backends.enabled={jobset}", "--set", "backends.default=jobset"),
                                  "ValidatingAdmissionPolicy") if p["metadata"]["name"].endswith("baseline-efa"))
    variable = next(v for v in efa["spec"]["variables"] if v["name"] == "efa")
    assert "jobset.sigs.k8s.io/jobset-name" in variable["expression"]


def test_the_operator_accepts_the_flags_the_chart_gives_it(helm):
    from llmtrain.controller.__main__ import backend_config, parse_args

    args = [a for a in _args(helm.manifests("--set", "backends.enabled={pytorchjob,jobset}",
                                            "--set-json", 'backends.namespaceDefaults={"team-a": "jobset"}'))
            if a.startswith(("--backend", "--default-backend", "--namespace-backend"))]
    assert backend_config(parse_args(args)) == (("pytorchjob", "jobset"), "pytorchjob", {"team-a": "jobset"})


def test_node_health_conditions_reach_the_operator(helm):
    from llmtrain.controller.__main__ import node_conditions, parse_args
    from llmtrain.controller.policy.sicknodes import DEFAULT_CONDITIONS

    def conditions(*values):
        args = parse_args([a for a in _args(helm.manifests(*values)) if a.startswith(("--node-conditions", "--free"))])
        return node_conditions(args.node_conditions), args.free_node_moves

    assert conditions() == (DEFAULT_CONDITIONS, 3)  # the EKS node monitoring agent's, by default
    assert conditions("--set-json", 'nodeHealth={"conditions": ["example.com/GpuHealthy"], "freeMoves": 1}') == (
        ("example.com/GpuHealthy",), 1)
    assert conditions("--set-json", 'nodeHealth={"conditions": []}') == ((), 3)  # off
    r = helm.template("--set-json", 'nodeHealth={"conditions": ["Kernel Ready"]}', check=False)
    assert r.returncode != 0 and "nodeHealth" in r.stderr, r.stderr


def test_user_roles_aggregate_into_view_edit_admin(helm):
    roles = {r["metadata"]["name"]: r for r in by_kind(helm.manifests(), "ClusterRole")}
    view, edit = roles["llmtrain-view"], roles["llmtrain-edit"]
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert {k: v for k, v in edit["metadata"]["labels"].items() if "aggregate-to" in k} == {
        "rbac.authorization.k8s.io/aggregate-to-edit": "true", "rbac.authorization.k8s.io/aggregate-to-admin": "true"}
    assert _rules(view) == {("llmtrain.dev", "llmtrainingjobs"): {"get", "list", "watch"},
                            ("llmtrain.dev", "llmtrainingjobs/status"): {"get", "list", "watch"}}
    # Users never write status: that is the operator's record.
    assert _rules(edit)[("llmtrain.dev", "llmtrainingjobs/status")] == {"get", "list", "watch"}
    assert {"create", "update", "patch", "delete"} <= _rules(edit)[("llmtrain.dev", "llmtrainingjobs")]
    assert not [r for r in by_kind(helm.manifests("--set", "rbac.userRoles=false"), "ClusterRole")
                if r["metadata"]["name"] in ("llmtrain-view", "llmtrain-edit")]


def _matches(selector: dict, labels: dict) -> bool:
    """Kubernetes label-selector semantics (matchLabels + In/NotIn/Exists/DoesNotExist)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {"Exists": present, "DoesNotExist": not present, "In": present and value in e.get("values", []),
              "NotIn": not present or value not in e.get("values", [])}[e["operator"]]
        if not ok:
            return False
    return True


def test_network_policies_admit_exactly_trainers_operator_and_prometheus(helm):
    """Issue 10, defect 9: the policies' selectors checked against the labels the pods really carry:
    worker pods as llmtrain.render renders them, the operator's pod template, Prometheus's."""
    from llmtrain.backends.pytorchjob import render_pytorchjob
    from llmtrain.validation import parse_spec

    docs = helm.manifests("-f", NAMESPACED, "--set", "etcd.enabled=true")
    pols = {p["metadata"]["name"]: p["spec"] for p in by_kind(docs, "NetworkPolicy")}
    etcd_pol, op_pol = pols["llmtrain-llmtrain-operator-etcd"], pols["llmtrain-llmtrain-operator"]
    etcd_pod = one(docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    op_pod = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert _matches(etcd_pol["podSelector"], etcd_pod) and not _matches(etcd_pol["podSelector"], op_pod)
    assert _matches(op_pol["podSelector"], op_pod) and not _matches(op_pol["podSelector"], etcd_pod)

    ptj = render_pytorchjob(parse_spec({"model": {"preset": "tiny"}, "cluster": {"instanceType": "cpu"}}),
                            "job", "team-a", default_etcd_endpoint="llmtrain-etcd.llmtrain-system.svc:2379")
    worker = ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"]

    def admitted(policy, pod_labels, namespace):
        ns_labels = {"kubernetes.io/metadata.name": namespace}
        for rule in policy["ingress"]:
            for peer in rule["from"]:
                in_ns = _matches(peer["namespaceSelector"], ns_labels) if "namespaceSelector" in peer \
                    else namespace == "llmtrain-system"  # no namespaceSelector: the policy's own namespace
                if in_ns and _matches(peer.get("podSelector", {}), pod_labels):
                    return [p["port"] for p in rule["ports"]]
        return []

    assert admitted(etcd_pol, worker, "team-a") == [2379]
    assert admitted(etcd_pol, worker, "team-c") == []  # not a watched namespace
    assert admitted(etcd_pol, {"app": "anything-else"}, "team-a") == []
    assert admitted(etcd_pol, op_pod, "llmtrain-system") == [2379]
    prometheus = {"app.kubernetes.io/name": "prometheus", "prometheus": "kube-prometheus-stack-prometheus"}
    assert admitted(op_pol, prometheus, "monitoring") == ["http-metrics"]
    assert admitted(op_pol, worker, "team-a") == [] and admitted(op_pol, prometheus, "team-a") == []
    ports = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert "http-metrics" in {p["name"] for p in ports}


def test_allow_list_values_reach_the_operator_environment(helm):
    env = {e["name"]: e.get("value") for e in
           one(helm.manifests("-f", ALL_ON), "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LLMTRAIN_ALLOWED_IMAGE_REGISTRIES"] == \
        "public.ecr.aws/llmtrain,111122223333.dkr.ecr.us-east-1.amazonaws.com/llmtrain"
    assert env["LLMTRAIN_ALLOWED_SERVICE_ACCOUNTS"] == "llmtrain-trainer"
    default_env = one(helm.manifests(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert not [e for e in default_env if e["name"].startswith("LLMTRAIN_ALLOWED_")]


def test_debug_tools_daemonset_runs_htop_and_nvtop_on_gpu_nodes_only_when_asked(helm):
    assert not by_kind(helm.manifests(), "DaemonSet")
    docs = helm.manifests("--set", "debugTools.enabled=true")
    ds = one(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert {c["name"] for c in pod["containers"]} == {"htop", "nvtop"}
    assert pod["hostPID"] is True and pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    # Tolerates exactly the taints the renderer's GPU pods tolerate (Terraform's GPU node groups).
    from llmtrain.render import GPU_TOLERATIONS
    assert all(t in pod["tolerations"] for t in GPU_TOLERATIONS)
    nvtop = next(c for c in pod["containers"] if c["name"] == "nvtop")
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in nvtop["env"]
    assert "nvidia.com/gpu" not in json.dumps(nvtop["resources"])  # watches GPUs, never allocates one
    # Its pods are not the operator's: the Service, the PDB and the NetworkPolicy must not pick them.
    labels = ds["spec"]["template"]["metadata"]["labels"]
    (svc,) = by_kind(docs, "Service")
    assert not _matches({"matchLabels": svc["spec"]["selector"]}, labels)
    pols = {p["metadata"]["name"]: p["spec"] for p in by_kind(docs, "NetworkPolicy")}
    assert not _matches(pols["llmtrain-llmtrain-operator"]["podSelector"], labels)
    # Its own policy admits nobody (kubectl exec goes through the kubelet, not the pod network).
    own = pols["llmtrain-llmtrain-operator-debug-tools"]
    assert _matches(own["podSelector"], labels) and not own.get("ingress")

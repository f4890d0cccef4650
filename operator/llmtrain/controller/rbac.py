"""Every Kubernetes API permission the operator needs, with the code that needs it.

The chart grants exactly these (charts/llmtrain-operator/templates/_rbac.tpl), and three tests keep
the three in step: tests/charts/test_operator_rbac.py derives the verbs from the API calls in this
package and from the kopf handlers it registers and compares them with this table;
tests/charts/test_chart_static.py compares the rendered roles with it; tests/charts/
test_chart_cluster.py runs the operator through a job's lifecycle with only the chart's
ServiceAccount against a real API server and fails on any RBAC denial.

Keys are (API group, resource[/subresource]); values are verbs.
"""

from __future__ import annotations

from ..backends import BACKENDS
from ..spec import GROUP, PLURAL

# In every namespace the operator watches (a ClusterRole when it watches all of them, else a Role
# per namespace).
JOB_RULES: dict[tuple[str, str], frozenset[str]] = {
    # kopf watches the jobs (on.event); kube.get_job reads one fresh before acting on it.
    (GROUP, PLURAL): frozenset({"get", "list", "watch"}),
    # kube.patch_job_status (a merge patch) and kube.patch_running_progress (the monitor's JSON
    # patch of status.progress): the only writes to a job, both of the status subresource.
    (GROUP, f"{PLURAL}/status"): frozenset({"patch"}),
    # caches.PodCache (watch.py) and nodes.py watch them (kopf on.event); nodes.PodFailures._listed
    # lists an attempt's pods.
    ("", "pods"): frozenset({"list", "watch"}),
    # kube.post_event (and kopf.info / kopf.warn) post core/v1 Events; none is ever patched, nor
    # is events.k8s.io used.
    ("", "events"): frozenset({"create"}),
    # kueue.read (kube.list_workloads): why a queued job waits, in Kueue's words. Read only.
    ("kueue.x-k8s.io", "workloads"): frozenset({"list"}),
}

# Per backend the platform enabled (chart: backends.enabled), in the same namespaces as JOB_RULES:
# kopf watches its children (watch.py, one watch per enabled backend); kube.get_child /
# create_child / delete_child. With an `owner` kind between the child and its pods (a JobSet's
# batch Jobs): kube.get_owner reads one to check whose its pods are (owners.py). Read only. With
# companions (the job backend's headless Service): kube.create_service, created only.
CHILD_VERBS = frozenset({"get", "list", "watch", "create", "delete"})
OWNER_VERBS = frozenset({"get"})
COMPANION_VERBS = frozenset({"create"})
BACKEND_RULES: dict[str, dict[tuple[str, str], frozenset[str]]] = {
    name: {
        (b.child.group, b.child.plural): CHILD_VERBS,
        **({(b.owner.group, b.owner.plural): OWNER_VERBS} if b.owner is not None else {}),
        **{(k.group, k.plural): COMPANION_VERBS for k in b.companion_kinds},
    }
    for name, b in BACKENDS.items()
}

# Cluster-scoped, in both modes.
CLUSTER_RULES: dict[tuple[str, str], frozenset[str]] = {
    # kopf watches CRDs to notice its resources appearing and going away.
    ("apiextensions.k8s.io", "customresourcedefinitions"): frozenset({"list", "watch"}),
    # taints.ready_nodes / taint_nodes count the Ready nodes of an instance type; the node watch
    # (watch.py, kopf on.event) reads the health conditions that move attempts off sick nodes
    # (sicknodes.py; not started with --node-conditions empty).
    ("", "nodes"): frozenset({"list", "watch"}),
}

# Only with --suspect-taint-fraction > 0 (chart: suspectNodeTaint.enabled): taints.taint_nodes and
# untaint_expired (the expiry).
SUSPECT_TAINT_RULES: dict[tuple[str, str], frozenset[str]] = {("", "nodes"): frozenset({"patch"})}

# Only with --job-network-policy (chart: jobNetworkPolicy.enabled): tenancy.create_networkpolicy,
# one per job. Created only: an existing one is left alone.
JOB_NETWORK_POLICY_RULES: dict[tuple[str, str], frozenset[str]] = {
    ("networking.k8s.io", "networkpolicies"): frozenset({"create"}),
}

# Only with --rendezvous-ca-dir (chart: etcd.enabled and etcd.auth.enabled): tenancy.create_secret
# writes each attempt's etcd credentials. create only, never get/list: the operator cannot read
# the tenants' Secrets.
RENDEZVOUS_AUTH_RULES: dict[tuple[str, str], frozenset[str]] = {("", "secrets"): frozenset({"create"})}

# Only with --leader-elect (chart: replicaCount > 1), in the operator's own namespace: leader.py
# reads, creates and replaces its Lease.
LEADER_ELECTION_RULES: dict[tuple[str, str], frozenset[str]] = {
    ("coordination.k8s.io", "leases"): frozenset({"get", "create", "update"}),
}

# In the operator's own namespace, always (chart: the same Role as the Lease's): retired.py's ledger
# of deleted jobs' node faults and node-hours (--reliability-configmap), read, created once, then
# replaced on its resourceVersion (kube.get_configmap / create_configmap / replace_configmap).
RELIABILITY_RULES: dict[tuple[str, str], frozenset[str]] = {
    ("", "configmaps"): frozenset({"get", "create", "update"}),
}

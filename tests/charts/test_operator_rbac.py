"""The operator's RBAC table (llmtrain/controller/rbac.py) against its code: every Kubernetes API
call in the controller package and every kopf handler, index and event post it registers is read
from the source (ast), turned into (API group, resource, verb), and must be exactly what the table
lists. A new call without its permission, or a permission no code uses any more, fails here; the
chart tests then hold the chart to the table.

Calls on a backend's kinds are written once for all backends: their group and plural are
attributes of `kind` (a backend's child kind) or `owner` (the kind between a child and its pods),
and stand for every backend's (llmtrain.backends), whose rules are rbac.BACKEND_RULES. API
discovery (`/apis/{group}/{version}`) is a non-resource URL every authenticated user may read
(system:discovery): no rule."""

from __future__ import annotations

import ast
import importlib
import re
from functools import cache

import kubernetes
import pytest

from chart_helpers import ROOT

pytestmark = pytest.mark.infra

CONTROLLER = ROOT / "operator" / "llmtrain" / "controller"


@cache
def client_methods() -> frozenset[str]:
    """Every method of the official client's API classes: a call by one of these names is an API
    call. (kubernetes.client loads its classes lazily: dir() + getattr, not vars().) Built on first
    use, not at import: loading every API class costs ~2 CPU-seconds, which every xdist worker would
    pay while collecting."""
    return frozenset(
        name
        for cls_name in dir(kubernetes.client)
        if cls_name.endswith("Api")
        for name in vars(getattr(kubernetes.client, cls_name))
        # closing a connection (scrape.py's aiohttp response) asks nothing
        if not name.startswith("_") and not name.endswith("_with_http_info") and name != "close"
    )


CLIENT_VERB = {
    "read": "get",
    "get": "get",
    "list": "list",
    "create": "create",
    "patch": "patch",
    "replace": "update",
    "delete": "delete",
}
METHOD = re.compile(
    r"^(read|get|list|create|patch|replace|delete)_(namespaced_)?(\w+?)(_status)?"
    r"(_for_all_namespaces)?$"
)
# The built-in kinds the operator may touch, as (API group, plural).
KINDS = {
    "pod": ("", "pods"),
    "node": ("", "nodes"),
    "event": ("", "events"),
    "lease": ("coordination.k8s.io", "leases"),
    "secret": ("", "secrets"),
    "network_policy": ("networking.k8s.io", "networkpolicies"),
}
KOPF_WATCHERS = {
    "kopf.on.event",
    "kopf.index",
    "kopf.on.create",
    "kopf.on.update",
    "kopf.on.delete",
    "kopf.on.resume",
    "kopf.on.field",
    "kopf.daemon",
    "kopf.timer",
}
KOPF_EVENT_POSTERS = {"kopf.info", "kopf.warn", "kopf.exception", "kopf.event"}
# Raw calls through ApiClient.param_serialize(method, path, ...): the verb from the HTTP method
# (a GET of a collection is a list), the group and resource from the path.
HTTP_VERB = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
RAW_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)(?:/namespaces/\{namespace\})?"
    r"/(?P<plural>[a-z]+)(?P<name>/\{name\})?(?:/(?P<sub>[a-z]+))?$"
)


# A backend's kinds, by the name the code gives them: every backend's child kind, every owner kind.
def _backend_kinds(base: str):
    from llmtrain.backends import BACKENDS

    if base == "kind":
        return [b.child for b in BACKENDS.values()]
    if base == "owner":
        return [b.owner for b in BACKENDS.values() if b.owner is not None]
    raise AssertionError(f"a backend kind named {base!r}: call it kind (a child) or owner")


DISCOVERY = re.compile(r"^/apis?(/(\{group\}|[a-z0-9.-]+))?(/(\{version\}|v[0-9a-z]+))?$")


def _raw_call(node: ast.Call, where: str) -> tuple[str, str, str, str]:
    method, path = (a.value if isinstance(a, ast.Constant) else None for a in node.args[:2])
    return _classify(method, path, where)


def _classify(method: str | None, path: str | None, where: str) -> tuple[str, str, str, str]:
    """(group, resource, verb, where) of an HTTP method and an API path template."""
    m = RAW_PATH.match(path or "")
    assert method and m, f"{where}: raw API call this test cannot classify; extend it"
    verb = HTTP_VERB.get(method) or ("get" if m.group("name") else "list")
    plural = m.group("plural") + (f"/{m.group('sub')}" if m.group("sub") else "")
    return m.group("group") or "", plural, verb, where


def _path_expr(module, node: ast.expr) -> str:
    """A path built from literals and module constants with `+` (kube._OBJECTS + "/{name}/status")."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _path_expr(module, node.left) + _path_expr(module, node.right)
    return _value(module, node)


def _request_call(module, node: ast.Call, where: str) -> list[tuple[str, str, str, str]]:
    """kube._request(method, path, params, ...): the {group} and {plural} placeholders of the path
    are filled from the params dict (literals, the module's constants, or a backend kind's
    attributes: one call per backend), then read as a raw call. Discovery: nothing."""
    assert len(node.args) >= 3 and isinstance(node.args[2], ast.Dict), f"{where}: cannot read _request's params"
    params = {_value(module, k): v for k, v in zip(node.args[2].keys, node.args[2].values, strict=True) if k}
    path = _path_expr(module, node.args[1])
    method = _value(module, node.args[0])
    if method == "GET" and DISCOVERY.match(path):
        return []
    bases = {v.value.id for k, v in params.items() if k in ("group", "plural") and isinstance(v, ast.Attribute)}
    assert len(bases) <= 1, f"{where}: group and plural from different kinds"
    kinds = _backend_kinds(bases.pop()) if bases else [None]
    out = []
    for kind in kinds:
        filled = path
        for key in ("group", "plural"):
            if key in params:
                value = getattr(kind, key) if kind is not None else _value(module, params[key])
                filled = filled.replace("{" + key + "}", value)
        out.append(_classify(method, filled.replace("{version}", "v"), where))
    return out


def _value(module, node: ast.expr) -> str:
    """A string literal or a module-level constant of the calling module (GROUP, PTJ_PLURAL...)."""
    if isinstance(node, ast.Constant):
        return node.value
    assert isinstance(node, ast.Name), f"{module.__name__}: cannot resolve {ast.unparse(node)} statically"
    return getattr(module, node.id)


def _enclosing_functions(tree: ast.Module) -> dict[int, str]:
    """id(call node) -> name of the function it is in."""
    out = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(fn):
                out.setdefault(id(n), fn.name)
    return out


@cache
def code_needs() -> list[tuple[str, str, str, str]]:
    """(group, resource, verb, where) for every API use in the controller package."""
    found = []
    for path in sorted(CONTROLLER.rglob("*.py")):  # the wiring, policy/ and adapters/
        dotted = ".".join(path.relative_to(CONTROLLER.parents[1]).with_suffix("").parts)
        module = importlib.import_module(dotted.removesuffix(".__init__"))
        tree = ast.parse(path.read_text())
        functions = _enclosing_functions(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = ast.unparse(node.func)
            where = f"{path.name}:{node.lineno} {functions.get(id(node), '<module>')}"
            if func in KOPF_WATCHERS:
                if all(isinstance(a, ast.Attribute) for a in node.args[:3]):  # a backend's kind: each one's
                    watched = [(k.group, k.plural) for k in _backend_kinds(node.args[0].value.id)]
                else:
                    group, _version, plural = (_value(module, a) for a in node.args[:3])
                    watched = [(group, plural)]
                found += [(g, p, verb, where) for g, p in watched for verb in ("list", "watch")]
            elif func in KOPF_EVENT_POSTERS:
                found.append(("", "events", "create", where))
            elif isinstance(node.func, ast.Attribute) and node.func.attr == "param_serialize":
                if functions.get(id(node)) != "_request":  # the one generic sender: its callers are read
                    found.append(_raw_call(node, where))
            elif func in ("_request", "kube._request"):
                found += _request_call(module, node, where)
            elif isinstance(node.func, ast.Attribute) and node.func.attr in client_methods():
                m = METHOD.match(node.func.attr)
                assert m, f"{where}: client call {node.func.attr} this test cannot classify; extend it"
                verb, namespaced, kind, status = CLIENT_VERB[m.group(1)], m.group(2), m.group(3), m.group(4)
                if kind == "custom_object":
                    group = _value(module, node.args[0])
                    plural = _value(module, node.args[3 if namespaced else 2])
                else:
                    assert kind in KINDS, f"{where}: {node.func.attr} touches {kind}: add it to KINDS and rbac.py"
                    group, plural = KINDS[kind]
                found.append((group, plural + ("/status" if status else ""), verb, where))
    return found


def _merge(*tables) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for t in tables:
        for key, verbs in t.items():
            out.setdefault(key, set()).update(verbs)
    return out


def test_the_scan_sees_the_calls_it_must():
    """Guards the scan itself: these calls exist today, so a scan that misses them is broken."""
    seen = {(g, r, v) for g, r, v, _ in code_needs()}
    for must in [
        ("llmtrain.dev", "llmtrainingjobs/status", "patch"),
        ("llmtrain.dev", "llmtrainingjobs", "get"),
        ("kubeflow.org", "pytorchjobs", "create"),
        ("kubeflow.org", "pytorchjobs", "delete"),
        ("kubeflow.org", "pytorchjobs", "watch"),
        ("jobset.x-k8s.io", "jobsets", "create"),
        ("jobset.x-k8s.io", "jobsets", "watch"),
        ("batch", "jobs", "get"),
        ("", "nodes", "list"),
        ("", "nodes", "patch"),
        ("coordination.k8s.io", "leases", "update"),
        ("", "pods", "watch"),
        ("", "events", "create"),
    ]:
        assert must in seen, must


def test_rbac_table_is_exactly_what_the_code_uses():
    from llmtrain.controller import rbac

    used: dict[tuple[str, str], set[str]] = {}
    for group, resource, verb, _ in code_needs():
        used.setdefault((group, resource), set()).add(verb)
    # kopf's own: it watches CRDs whatever handlers are registered (not visible as a call here).
    used.setdefault(("apiextensions.k8s.io", "customresourcedefinitions"), set()).update({"list", "watch"})
    table = _merge(
        rbac.JOB_RULES,
        *rbac.BACKEND_RULES.values(),
        rbac.CLUSTER_RULES,
        rbac.SUSPECT_TAINT_RULES,
        rbac.LEADER_ELECTION_RULES,
        rbac.RELIABILITY_RULES,
        rbac.JOB_NETWORK_POLICY_RULES,
        rbac.RENDEZVOUS_AUTH_RULES,
    )
    assert table == used


def test_conditional_permissions_are_used_only_where_they_are_conditional():
    """Node patches only in the suspect-taint path, Lease calls only in leader election: the chart
    grants them only when those features are on."""
    for group, resource, verb, where in code_needs():
        if (group, resource, verb) == ("", "nodes", "patch"):
            assert where.startswith("taints.py:") and where.endswith((" taint_nodes", " untaint_expired")), where
        if resource == "leases":
            assert where.startswith("leader.py:"), where
        if resource in ("secrets", "networkpolicies"):
            assert where.startswith("tenancy.py:") and verb == "create", where

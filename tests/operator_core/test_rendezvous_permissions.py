"""What every identity may write on the shared rendezvous etcd (issue 33), tried request by request
on a real etcd 3.4 with the chart's flags and the operator's bootstrap, not read off the roles.

The targets: every key torch writes for an attempt of team-a and of team-b (both backends, with the
conf the operator renders, and torch's default legacy layout that attempts started before issue 33
keep), every key a role's pattern names, and every directory above any of them, each also with a
trailing slash (etcd checks the permission of the key as the URL spells it). On each, every v2
write form, as team-a, as team-b and as a certificate whose CommonName is no etcd user. After each
request root reads the whole tree: what changed must lie in the acting namespace's own key space,
a request on anything else must be refused by auth (401), and on its own attempt's keys auth must
let the owner through. (Root reads the tree after each owner's request, and after all the forms
on a key that is not the identity's own.)"""

from __future__ import annotations

import base64
import json
import posixpath
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest
import urllib3

from llmtrain import rendezvous_auth as ra
from llmtrain.pod_contract import rendezvous_id

NAMESPACES = ("team-a", "team-b")
STRANGER = "someone-else"  # a certificate of the CA whose CommonName is no etcd user: a guest
# torch's own paths (etcd_rendezvous_backend.create_backend, etcd_rendezvous's default etcd_prefix)
TORCH_STATE, TORCH_STORE, TORCH_LEGACY = "/torch/elastic/rendezvous", "/torch/elastic/store", "/torchelastic/p2p"
TTL = "30"  # long enough that nothing expires between a request and root's look at the tree


def legacy_prefix(namespace: str) -> str:
    """The etcd_prefix in the --rdzv-conf the operator renders for the legacy backend."""
    conf = dict(kv.split("=", 1) for kv in ra.rdzv_conf("etcd", namespace).split(","))
    return conf["etcd_prefix"]


def torch_keys(namespace: str) -> dict[str, bool]:
    """{key: is a directory} of what torch writes for an attempt of `namespace`."""
    rid = rendezvous_id(namespace, "llama", "0123456789", 1)
    store = base64.b64encode(f"torch.rendezvous.{rid}.0/MASTER_ADDR".encode()).decode()
    run = f"{legacy_prefix(namespace)}/run_{rid}"
    old_run = f"{TORCH_LEGACY}/run_{rid}"  # torch's default layout: attempts from before issue 33
    return {
        f"{TORCH_STATE}/{rid}": False,
        f"{TORCH_STORE}/{store}": False,
        legacy_prefix(namespace): True,
        run: True,
        f"{run}/rdzv": True,
        f"{run}/rdzv/active_version": False,
        old_run: True,
        f"{old_run}/rdzv/active_version": False,
    }


def own_space(namespace: str) -> tuple[str, ...]:
    """Where every key of every run id of `namespace` lies: ids start with the namespace's prefix
    (pod_contract.rendezvous_id), which no other namespace's ids start with."""
    p = ra.tenant_prefix(namespace)
    store = base64.b64encode(f"torch.rendezvous.{p}".encode()).decode()
    return (f"{TORCH_STATE}/{p}", f"{TORCH_STORE}/{store}", legacy_prefix(namespace), f"{TORCH_LEGACY}/run_{p}")


def owns(namespace: str | None, key: str) -> bool:
    return namespace is not None and any(key.startswith(s) for s in own_space(namespace))


def ancestors(key: str) -> Iterator[str]:
    while key != "/":
        key = posixpath.dirname(key)
        yield key


def targets() -> list[str]:
    concrete = {k for ns in NAMESPACES for k in torch_keys(ns)}
    patterns = {p for ns in NAMESPACES for kind in ("read", "write") for p in ra.permissions(ns)[kind]}
    named = {p.rstrip("*") for p in patterns} | {p.rstrip("*") + "probe" for p in patterns if p.endswith("*")}
    keys = concrete | named | {ra.MARKER_PATH[len("/v2/keys") :]}
    shared = {a for k in keys for a in ancestors(k.rstrip("/"))}
    return sorted(keys | shared | {d + "/" for d in shared if d != "/"})


def forms(node: tuple | None) -> list[tuple[str, dict]]:
    """Every v2 write form, the compare-and-swap ones with the node's current value and index (a
    `tree` entry; so that only auth can stop them)."""
    _, value, _, _, index = node or (None, None, None, None, 1)
    value, index = value or "x", str(index)
    return [
        ("PUT", {"value": "hostile"}),
        ("PUT", {"value": "hostile", "ttl": TTL}),
        ("PUT", {"dir": "true"}),
        ("PUT", {"dir": "true", "ttl": TTL, "prevExist": "true"}),  # issue 33's request
        ("PUT", {"value": "hostile", "prevExist": "true"}),
        ("PUT", {"value": "hostile", "prevExist": "false"}),
        ("PUT", {"value": "hostile", "prevValue": value}),
        ("PUT", {"value": "hostile", "prevIndex": index}),
        ("PUT", {"refresh": "true", "ttl": TTL, "prevExist": "true"}),
        ("PUT", {"refresh": "true", "ttl": TTL, "prevExist": "true", "dir": "true"}),
        ("POST", {"value": "hostile"}),
        ("DELETE", {}),
        ("DELETE", {"dir": "true"}),
        ("DELETE", {"recursive": "true"}),
        ("DELETE", {"prevValue": value}),
        ("DELETE", {"prevIndex": index}),
    ]


class Etcd:
    """v2 requests as one identity, over one kept-alive TLS connection."""

    def __init__(self, endpoint: str, creds: ra.Credentials, tmp: Path):
        d = creds.write(tmp / uuid.uuid4().hex[:8])
        host, port = endpoint.split(":")
        self.pool = urllib3.HTTPSConnectionPool(
            host,
            int(port),
            maxsize=1,
            block=True,
            retries=False,
            timeout=10.0,
            cert_file=str(d / ra.CERT_KEY),
            key_file=str(d / ra.KEY_KEY),
            ca_certs=str(d / ra.CA_KEY),
        )

    def request(self, method: str, key: str, params: dict | None = None, raw: bool = False) -> tuple[int, dict]:
        """`raw`: the key goes into the URL as it is (escapes and all)."""
        url = "/v2/keys" + (key if raw else quote(key))
        if method == "PUT" or method == "POST":
            r = self.pool.request(
                method,
                url,
                body=urlencode(params or {}),
                headers={"Content-Type": "application/x-www-form-urlencoded"},
                redirect=False,
            )
        else:
            r = self.pool.request(method, url + ("?" + urlencode(params) if params else ""), redirect=False)
        try:
            return r.status, json.loads(r.data or b"{}")
        except ValueError:
            return r.status, {}


def tree(root: Etcd) -> dict[str, tuple]:
    """Every node, as root sees it: (dir, value, expiration, createdIndex, modifiedIndex)."""
    status, out = root.request("GET", "/", {"recursive": "true"})
    assert status == 200, out
    nodes: dict[str, tuple] = {}

    def walk(n: dict) -> None:
        if "key" in n:
            fields = ("dir", "value", "expiration", "createdIndex", "modifiedIndex")
            nodes[n["key"]] = tuple(n.get(f) for f in fields)
        for child in n.get("nodes") or []:
            walk(child)

    walk(out["node"])
    return nodes


def restore(root: Etcd, want: dict[str, tuple], have: dict[str, tuple]) -> None:
    """Put back, as root, what an owner's own request changed."""
    for key in sorted(set(have) - set(want)):
        if posixpath.dirname(key) in want:  # the top of what was added
            root.request("DELETE", key, {"recursive": "true"})
    for key in sorted(k for k in want if have.get(k) != want[k]):
        is_dir, value = want[key][:2]
        if key in have and bool(have[key][0]) != bool(is_dir):
            root.request("DELETE", key, {"recursive": "true"})
        status, out = root.request("PUT", key, {"dir": "true", "prevExist": "true"} if is_dir else {"value": value})
        if status == 404 or (status == 412 and is_dir):  # gone: create it (412: a dir exists already)
            status, out = root.request("PUT", key, {"dir": "true"} if is_dir else {"value": value})
        assert status in (200, 201), (key, status, out)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    """(root, {identity: client}) on etcd bootstrapped by the operator's code, with every key of
    torch_keys for both namespaces written by root."""
    from secured_etcd import secured_etcd

    tmp = tmp_path_factory.mktemp("permissions")
    ca = ra.CertificateAuthority.generate()
    with secured_etcd(tmp / "etcd", ca) as endpoint:
        admin = ra.EtcdAdmin(endpoint, ca)
        admin.bootstrap()
        for ns in NAMESPACES:
            admin.ensure_namespace(ns)
        root = Etcd(endpoint, ca.issue(ra.ROOT_USER), tmp)
        for ns in NAMESPACES:
            for key, is_dir in sorted(torch_keys(ns).items()):
                status, out = root.request("PUT", key, {"dir": "true"} if is_dir else {"value": f"{ns}'s"})
                assert status in (200, 201), out
        clients = {who: Etcd(endpoint, ca.issue(ra.user_name(who)), tmp) for who in NAMESPACES}
        clients[STRANGER] = Etcd(endpoint, ca.issue(STRANGER), tmp)
        yield root, clients


def test_the_key_spaces_hold_torchs_keys_and_share_nothing():
    """The test's own premise: each namespace's keys lie in its space, the spaces are disjoint, and
    no shared directory (nor anything above it) lies in any."""
    for ns in NAMESPACES:
        other = next(o for o in NAMESPACES if o != ns)
        assert all(owns(ns, k) and not owns(other, k) for k in torch_keys(ns))
    for key in targets():
        assert sum(owns(ns, key) for ns in NAMESPACES) <= 1, key
    for d in ra.SHARED_DIRS:
        assert not any(owns(ns, a) for ns in NAMESPACES for a in (d, d + "/", *ancestors(d)))


def test_every_write_form_on_every_key_as_every_identity(etcd):
    root, clients = etcd
    baseline = tree(root)
    # root made the shared directories at bootstrap, permanent, before any tenant wrote
    for d in ra.SHARED_DIRS:
        assert baseline[d][0] and baseline[d][2] is None, (d, baseline[d])
    own_keys = {ns: set(torch_keys(ns)) for ns in NAMESPACES}
    written: dict[str, set[str]] = {ns: set() for ns in NAMESPACES}  # own keys a request changed
    for who, client in clients.items():
        ns = who if who in NAMESPACES else None
        for key in targets():
            own = owns(ns, key)
            for method, params in forms(baseline.get(key.rstrip("/") or "/")):
                status, out = client.request(method, key, params)
                what = f"{who}: {method} {key} {params} -> {status} {out}"
                if not own:
                    # refused by auth itself, before etcd's store looks at anything: a request that
                    # got past auth and failed later for another reason fails the test too
                    assert status == 401 and out.get("errorCode") == 110, what
                    continue
                after = tree(root)
                changed = {k for k in set(baseline) | set(after) if baseline.get(k) != after.get(k)}
                assert all(owns(ns, k) for k in changed), f"{what} changed {sorted(changed)}"
                if key.rstrip("/") in own_keys[ns]:
                    assert status != 401, what  # the owner may write its attempt's keys
                    if key.rstrip("/") in changed:
                        written[ns].add(key.rstrip("/"))
                if changed:
                    restore(root, baseline, after)
                    now = tree(root)
                    assert {k: v[:3] for k, v in now.items()} == {k: v[:3] for k, v in baseline.items()}
                    baseline = now
            if not own:  # every write leaves a trace (an index only goes up): none may be there
                assert tree(root) == baseline, f"{who}'s requests on {key} changed the tree"
    # and the owners' requests did change each of their keys (auth let them through to real writes)
    assert written == own_keys


def test_escaped_paths_reach_nothing(etcd):
    """Keys spelled so that etcd's decoded, cleaned path differs from the one it would check: an
    own prefix, then `..` up to a shared or the other namespace's directory (etcd answers with a
    redirect to the clean path), or the shared directory with an escaped slash. Nothing changes,
    whoever asks."""
    root, clients = etcd
    baseline = tree(root)
    up = "%2F%2E%2E" * 4  # "/.." escaped, so that the client does not resolve it itself
    rid_b = rendezvous_id("team-b", "llama", "0123456789", 1)
    tricks = [
        f"{TORCH_STATE}/{ra.tenant_prefix('team-a')}x{up}%2Ftorchelastic%2Fp2p",
        f"{legacy_prefix('team-a')}{up}%2Ftorch%2Felastic%2Frendezvous%2F{quote(rid_b)}",
        f"{legacy_prefix('team-a')}%2F%2E%2E",
        f"{TORCH_LEGACY}%2F",
        f"{TORCH_LEGACY}%2F%2E",
    ]
    for who, client in clients.items():
        for key in tricks:
            for method, params in forms(None):
                status, out = client.request(method, key, params, raw=True)
                assert not 200 <= status < 300, f"{who}: {method} {key} {params} -> {status} {out}"
    assert tree(root) == baseline

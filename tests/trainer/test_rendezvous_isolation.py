"""Tenant isolation on the shared rendezvous etcd (issue 18, item 3), on a real etcd 3.4 with the
flags the chart gives it (HTTPS, client certificates required, v2 API on) and the operator's
identities (llmtrain/rendezvous_auth.py), with real torchrun agents.

A job's rendezvous state is a pickle every agent of the job loads, so whoever writes it runs code
in that job. Here a second namespace's identity tries, and etcd itself refuses; the first job
still trains end to end with its own credentials."""

from __future__ import annotations

import base64
import json
import logging
import ssl
import urllib.error
import urllib.request
import uuid

import etcd as python_etcd
import pytest

from conftest import base_spec, run_to_end
from llmtrain import rendezvous_auth as ra
from llmtrain.backends.pytorchjob import render_pytorchjob
from llmtrain.pod_contract import rendezvous_id
from llmtrain.validation import parse_spec


@pytest.fixture(scope="module")
def secured_etcd(tmp_path_factory):
    """(endpoint, CA, admin): etcd as the chart runs it, bootstrapped by the operator's code
    (auth on, guest allowed nothing), namespaces team-a and team-b given identities."""
    from secured_etcd import secured_etcd as start

    ca = ra.CertificateAuthority.generate()
    with start(tmp_path_factory.mktemp("secured-etcd"), ca) as endpoint:
        admin = ra.EtcdAdmin(endpoint, ca)
        admin.bootstrap()
        admin.bootstrap()  # idempotent: an operator restart runs it again
        for ns in ("team-a", "team-b"):
            admin.ensure_namespace(ns)
        yield endpoint, ca, admin


def client(endpoint: str, creds: ra.Credentials, tmp) -> python_etcd.Client:
    """python-etcd as torch's etcd-v2 backend builds it (etcd_rendezvous_backend._create_etcd_client)."""
    d = creds.write(tmp / uuid.uuid4().hex[:8])
    host, port = endpoint.split(":")
    return python_etcd.Client(
        host,
        int(port),
        protocol="https",
        cert=(str(d / ra.CERT_KEY), str(d / ra.KEY_KEY)),
        ca_cert=str(d / ra.CA_KEY),
        read_timeout=10,
    )


def rendered(backend: str, namespace: str, endpoint: str, creds_dir) -> tuple[str, str]:
    """(rendezvous id, --rdzv-conf) of a job's attempt in `namespace` as the operator renders them
    for its etcd, with the credentials' directory moved from the pod's mount to `creds_dir`."""
    spec = parse_spec(base_spec(**{"rendezvous.backend": backend}))
    ptj = render_pytorchjob(spec, "llama", namespace, 1, uuid.uuid4().hex, endpoint, rendezvous_credentials=True)
    args = ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["args"]
    [conf] = [a.split("=", 1)[1] for a in args if a.startswith("--rdzv-conf=")]
    return ptj["spec"]["elasticPolicy"]["rdzvId"], conf.replace(ra.MOUNT_PATH, str(creds_dir))


def refused(fn) -> bool:
    try:
        fn()
    except (python_etcd.EtcdException, python_etcd.EtcdKeyNotFound) as e:
        # python-etcd raises EtcdException("Insufficient credentials") on etcd's 401
        return "credentials" in str(e).lower() or "unauthorized" in str(e).lower()
    return False


def test_another_namespace_cannot_read_or_write_a_jobs_rendezvous(secured_etcd, tmp_path):
    endpoint, ca, _ = secured_etcd
    a = client(endpoint, ca.issue(ra.user_name("team-a")), tmp_path)
    b = client(endpoint, ca.issue(ra.user_name("team-b")), tmp_path)
    run_a = rendezvous_id("team-a", "llama", "0123456789", 1)
    run_b = rendezvous_id("team-b", "llama", "0123456789", 1)
    state_a = ra.STATE_PREFIX + run_a
    store_a = f"{ra.STORE_DIR}/" + base64.b64encode(f"torch.rendezvous.{run_a}.0/MASTER_ADDR".encode()).decode()
    a.write(state_a, "a's state")
    a.write(store_a, "10.0.0.1")

    # What a hostile tenant would do: replace the pickle, read it, delete it, redirect rank 0.
    assert refused(lambda: b.write(state_a, base64.b64encode(b"cos\nsystem\n(S'id'\ntR.").decode())), (
        "team-b wrote team-a's rendezvous state"
    )
    assert refused(lambda: b.read(state_a)), "team-b read team-a's rendezvous state"
    assert refused(lambda: b.delete(state_a)), "team-b deleted team-a's rendezvous state"
    assert refused(lambda: b.write(store_a, "10.6.6.6")), "team-b wrote team-a's store"
    assert refused(lambda: b.write(f"{ra.LEGACY_DIR}/run_{run_a}/rdzv/active_version", "x"))
    # a namespace whose name extends team-a's is no way in either
    run_a2 = rendezvous_id("team-a2", "llama", "0123456789", 1)
    assert refused(lambda: a.write(ra.STATE_PREFIX + run_a2, "x"))
    assert a.read(state_a).value == "a's state" and a.read(store_a).value == "10.0.0.1"
    # b works in its own keys
    b.write(ra.STATE_PREFIX + run_b, "b's state")
    assert b.read(ra.STATE_PREFIX + run_b).value == "b's state"

    # A certificate of the right CA whose CommonName is no etcd user is a guest, allowed nothing.
    stranger = client(endpoint, ca.issue("someone-else"), tmp_path)
    assert refused(lambda: stranger.write(state_a, "x")) and refused(lambda: stranger.read(state_a))
    assert refused(lambda: stranger.write("/anything", "x"))
    # And a tenant cannot grant itself more: the auth API is root's.
    with pytest.raises(ra.EtcdAuthError):
        tenant_admin = ra.EtcdAdmin.__new__(ra.EtcdAdmin)
        tenant_admin.base, tenant_admin.timeout = f"https://{endpoint}", 10
        tenant_admin._ctx = _ctx(ca.issue(ra.user_name("team-b")), tmp_path)
        tenant_admin._call(
            "PUT",
            f"/v2/auth/roles/{ra.user_name('team-b')}",
            {"role": ra.user_name("team-b"), "grant": {"kv": {"read": ["/*"], "write": ["/*"]}}},
        )


def test_a_ttl_on_a_shared_legacy_directory_leaves_the_other_namespaces_rendezvous_in_place(secured_etcd, tmp_path):
    """Issue 33: etcd v2 checks the exact key for a TTL update of a directory, and every identity
    could write `/torchelastic/p2p`, so team-b's one `PUT ?ttl=1&dir=true&prevExist=true` there
    expired the legacy-backend rendezvous of every namespace. torch's legacy backend, set up as the
    operator renders team-a's job, creates its keys; team-b then tries that on every directory
    above them, and they stay as they were."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters, etcd_rendezvous
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

    endpoint, ca, admin = secured_etcd
    creds = ca.issue(ra.user_name("team-a")).write(tmp_path / "team-a")
    rid, conf = rendered("etcd", "team-a", endpoint, creds)
    params = RendezvousParameters("etcd", endpoint, rid, 1, 1, **_parse_rendezvous_config(conf))
    # as torchrun does: the prefix directory, the run's directory (with its TTL), its counter
    handler = etcd_rendezvous.create_rdzv_handler(params)
    run_dir = handler._rdzv_impl.get_path("").rstrip("/")
    a = client(endpoint, ca.issue(ra.user_name("team-a")), tmp_path)
    before = {n.key: n.value for n in a.read(run_dir, recursive=True).leaves}
    assert f"{run_dir}/rdzv/version_counter" in before

    b = client(endpoint, ca.issue(ra.user_name("team-b")), tmp_path)
    parts = run_dir.strip("/").split("/")
    above = ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]  # /torchelastic ... run_dir's parent
    assert ra.LEGACY_DIR in above
    for d in above:
        for path in (d, d + "/"):
            assert refused(lambda p=path: b.write(p, None, dir=True, prevExist=True, ttl=1)), (
                f"team-b set a TTL on {path}"
            )
            assert refused(lambda p=path: b.refresh(p, ttl=1)), f"team-b refreshed {path} with a TTL"

    # No directory above team-a's run expires, and team-a's keys are all there.
    for d in above:
        _, node = admin._call("GET", f"/v2/keys{d}")
        assert "ttl" not in node["node"] and "expiration" not in node["node"], f"{d} expires: {node}"
    assert {n.key: n.value for n in a.read(run_dir, recursive=True).leaves} == before
    assert not handler.is_closed()
    del handler  # stops its lease renewal


def _ctx(creds: ra.Credentials, tmp) -> ssl.SSLContext:
    d = creds.write(tmp / uuid.uuid4().hex[:8])
    ctx = ssl.create_default_context(cafile=str(d / ra.CA_KEY))
    ctx.load_cert_chain(d / ra.CERT_KEY, d / ra.KEY_KEY)
    return ctx


def test_the_v3_api_and_plain_clients_are_shut_too(secured_etcd, tmp_path):
    endpoint, ca, _ = secured_etcd
    # v3: auth is on with no user but root. Through the JSON gateway (a certificate without a
    # CommonName, as the gateway requires) an unauthenticated put is refused; over gRPC a tenant's
    # certificate names no v3 user and is refused the same way.
    req = urllib.request.Request(
        f"https://{endpoint}/v3/kv/put",
        method="POST",
        data=json.dumps(
            {"key": base64.b64encode(b"x").decode(), "value": base64.b64encode(b"y" * 1000).decode()}
        ).encode(),
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10, context=_ctx(ca.issue(""), tmp_path))
    assert e.value.code == 403 and b"permission denied" in e.value.read()
    # No certificate of the CA: the TLS handshake itself fails.
    bare = ssl.create_default_context(cafile=None)
    bare.load_verify_locations(cadata=ca.cert_pem.decode())
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"https://{endpoint}/v2/keys/", timeout=10, context=bare).read()
    foreign = ra.CertificateAuthority.generate("someone's own CA").issue(ra.user_name("team-a"))
    fctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    d = foreign.write(tmp_path / "foreign")
    fctx.load_cert_chain(d / ra.CERT_KEY, d / ra.KEY_KEY)
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"https://{endpoint}/v2/keys/", timeout=10, context=fctx).read()


@pytest.mark.slow  # a multi-process run: more than 5 s
@pytest.mark.parametrize("backend", ["etcd-v2", "etcd"])
def test_a_job_trains_end_to_end_with_its_own_credentials(backend, secured_etcd, corpus, launch, tmp_path):
    """Two torchrun "nodes" of team-a meet through the secured etcd, with the rendezvous id and
    rdzv-conf the operator renders, and train; their keys are where docs/concepts/rendezvous.md
    says, and team-b's identity is refused on them."""
    endpoint, ca, admin = secured_etcd
    creds = ca.issue(ra.user_name("team-a")).write(tmp_path / "team-a")
    rid, conf = rendered(backend, "team-a", endpoint, creds)
    spec = base_spec(**{"data.uri": corpus, "rendezvous.backend": backend, "training.maxSteps": 2})
    nodes = [
        launch(spec, nproc=1, nnodes=2, rdzv=(backend, endpoint), rdzv_id=rid, rdzv_conf=conf, name=f"node{i}")
        for i in range(2)
    ]
    for n in nodes:
        run_to_end(n)
    main = [n for n in nodes if n.of("config")]
    assert len(main) == 1 and main[0].of("config")[0]["world_size"] == 2
    assert sorted(main[0].losses()) == [1, 2]

    a = client(endpoint, ca.issue(ra.user_name("team-a")), tmp_path)
    b = client(endpoint, ca.issue(ra.user_name("team-b")), tmp_path)
    if backend == "etcd-v2":
        assert a.read(ra.STATE_PREFIX + rid).value  # the state torch left behind: team-a's own
        keys = [ra.STATE_PREFIX + rid] + [
            n.key
            for n in a.read(ra.STORE_DIR + "/", recursive=True).leaves
            if base64.b64decode(n.key[len(ra.STORE_DIR) + 1 :]).startswith(f"torch.rendezvous.{rid}".encode())
        ]
        assert len(keys) > 1, "torch wrote its store keys under the job's prefix"
    else:
        # team-a's own directory under the shared one; nothing at torch's default place
        run_dir = f"{ra.LEGACY_DIR}/team-a./run_{rid}"
        keys = [n.key for n in a.read(run_dir, recursive=True).leaves]
        assert f"{run_dir}/rdzv/active_version" in keys
        status, _ = admin._call("GET", f"/v2/keys{ra.LEGACY_DIR}/run_{rid}", ok=(200, 404))
        assert status == 404
    # the store is read as a directory by everyone (rendezvous_auth.py); the rest is team-a's only
    private = [k for k in keys if not k.startswith(ra.STORE_DIR + "/")]
    assert private and all(refused(lambda k=k: b.read(k)) for k in private)
    assert all(refused(lambda k=k: b.write(k, "10.6.6.6")) for k in keys)


def test_an_attempt_started_before_the_upgrade_keeps_its_legacy_rendezvous(tmp_path, caplog):
    """The release before issue 33 granted every namespace `/torchelastic/p2p` itself and rendered
    no etcd_prefix, so a running attempt's agents use torch's default layout. The upgraded
    operator (a new process: bootstrap on the running etcd) revokes the shared grants, makes the
    shared directory permanent again where an identity had set a TTL on it, and the running
    attempt still completes its next rendezvous round in its old place."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters, etcd_rendezvous

    from secured_etcd import secured_etcd as start

    ca = ra.CertificateAuthority.generate()
    with start(tmp_path / "etcd", ca) as endpoint:
        old = ra.EtcdAdmin(endpoint, ca)
        old.bootstrap()
        for ns in ("team-a", "team-b"):
            old.ensure_namespace(ns)
            name, p = ra.user_name(ns), ra.tenant_prefix(ns)
            # the previous release's role: on the legacy backend's keys `/torchelastic/p2p/run_<p>*`
            # (kept) and the shared directory itself, not a directory of the namespace's own
            grant = {"read": [], "write": ["/torchelastic/p2p", "/torchelastic/p2p/"]}
            revoke = {k: [f"/torchelastic/p2p/{p}*"] for k in ("read", "write")}
            old._call("PUT", f"/v2/auth/roles/{name}", {"role": name, "revoke": {"kv": revoke}})
            old._call("PUT", f"/v2/auth/roles/{name}", {"role": name, "grant": {"kv": grant}})
        creds = ca.issue(ra.user_name("team-a")).write(tmp_path / "team-a")
        rid = rendezvous_id("team-a", "llama", "0123456789", 1)
        conf = {
            "protocol": "https",
            "cacert": creds / ra.CA_KEY,
            "cert": creds / ra.CERT_KEY,
            "key": creds / ra.KEY_KEY,
        }
        params = RendezvousParameters(
            "etcd", endpoint, rid, 1, 1, local_addr="127.0.0.1", **{k: str(v) for k, v in conf.items()}
        )
        handler = etcd_rendezvous.create_rdzv_handler(params)  # torch creates /torchelastic/p2p/ itself
        assert handler._rdzv_impl.get_path("") == f"/torchelastic/p2p/run_{rid}/"
        b = client(endpoint, ca.issue(ra.user_name("team-b")), tmp_path)
        b.write(ra.LEGACY_DIR, None, dir=True, prevExist=True, ttl=600)  # the hole, while it was open

        with caplog.at_level(logging.WARNING, logger="llmtrain.operator"):
            ra.EtcdAdmin(endpoint, ca).bootstrap()  # the upgraded operator starts
        assert f"{ra.LEGACY_DIR} was to expire" in caplog.text  # what it corrected, and why

        for ns in ("team-a", "team-b"):
            _, role = old._call("GET", f"/v2/auth/roles/{ra.user_name(ns)}")
            assert {k: sorted(v) for k, v in role["permissions"]["kv"].items()} == ra.permissions(ns)
        _, node = old._call("GET", f"/v2/keys{ra.LEGACY_DIR}")
        assert node["node"].get("dir") and "ttl" not in node["node"], node
        assert refused(lambda: b.write(ra.LEGACY_DIR, None, dir=True, prevExist=True, ttl=1))
        info = handler.next_rendezvous()  # the running attempt's next round, in the old place
        assert (info.rank, info.world_size) == (0, 1)
        a = client(endpoint, ca.issue(ra.user_name("team-a")), tmp_path)
        assert a.read(f"/torchelastic/p2p/run_{rid}/rdzv/active_version").value
        del handler


def test_an_etcd_restarted_without_its_data_is_secured_again_before_the_next_attempt(tmp_path):
    """The chart's etcd keeps its data in an emptyDir: after a restart auth is off, and any
    certificate holder may write users, roles and keys until the operator notices. It notices
    before its next attempt (ensure_current) and starts from nothing: what was planted is gone."""
    from secured_etcd import secured_etcd as start

    ca = ra.CertificateAuthority.generate()
    port = None
    admin = None
    with start(tmp_path / "first", ca) as endpoint:
        port = int(endpoint.split(":")[1])
        admin = ra.EtcdAdmin(endpoint, ca)
        admin.bootstrap()
        admin.ensure_namespace("team-a")
        admin.ensure_current()  # nothing changed: no new bootstrap
    with start(tmp_path / "second", ca, client_port=port) as endpoint:  # same address, no data
        b = client(endpoint, ca.issue(ra.user_name("team-b")), tmp_path)
        future = ra.STATE_PREFIX + rendezvous_id("team-a", "llama", "0123456789", 2)
        b.write(future, "a pickle")  # auth is off: nothing stops this yet
        # b makes itself an all-powerful user and turns auth on with a password it knows
        evil = ra.EtcdAdmin.__new__(ra.EtcdAdmin)
        evil.base, evil.timeout, evil._ctx = f"https://{endpoint}", 10, _ctx(ca.issue("nobody"), tmp_path)
        evil._call("PUT", "/v2/auth/users/root", {"user": "root", "password": "known"}, ok=(201,))
        evil._call(
            "PUT", "/v2/auth/users/evil", {"user": "evil", "password": "known", "roles": ["root"]}, ok=(200, 201)
        )
        evil._call("PUT", "/v2/keys/llmtrain/rendezvous-auth", form={"value": "planted"}, ok=(200, 201))
        evil._call("PUT", "/v2/auth/enable", ok=(200,))

        admin.ensure_current()
        admin.ensure_namespace("team-a")
        a = client(endpoint, ca.issue(ra.user_name("team-a")), tmp_path)
        with pytest.raises(python_etcd.EtcdKeyNotFound):
            a.read(future)  # the planted state is gone
        assert refused(lambda: b.write(future, "a pickle"))
        users = admin._names("/v2/auth/users", "users", "user")
        assert "evil" not in users and ra.user_name("team-a") in users
        for d in ra.SHARED_DIRS:  # root made the shared directories again, permanent
            _, node = admin._call("GET", f"/v2/keys{d}")
            assert node["node"].get("dir") and "expiration" not in node["node"], node
        # the password b set for root works no more
        basic = urllib.request.Request(
            f"https://{endpoint}/v2/keys/torch?recursive=true",
            method="DELETE",
            headers={"Authorization": "Basic " + base64.b64encode(b"root:known").decode()},
        )
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(basic, timeout=10, context=_ctx(ca.issue("nobody"), tmp_path))
        assert e.value.code == 401

"""Per-namespace identities on the shared rendezvous etcd (docs/operations/tenant-isolation.md).

torch keeps each elastic rendezvous state as a base64 pickle in etcd and every agent of the job
unpickles it, so whoever can write a job's rendezvous key runs code in its training. The etcd
therefore authenticates every client and limits each to its own namespace's keys:

- etcd serves HTTPS only and requires a client certificate signed by llmtrain's rendezvous CA
  (`--client-cert-auth`). etcd's v2 API takes the certificate's CommonName as the user
  (etcdserver/api/v2http/client_auth.go, userFromClientCertificate), which is what lets stock torch
  use it: its etcd backends pass only a CA and a client certificate to python-etcd, no password.
- The operator holds the CA key. It talks to etcd as `root` (a certificate it signs itself), turns
  v2 auth on with a guest role that may do nothing, and gives each namespace a user and a role
  whose permissions cover only the keys of that namespace's run ids (`permissions`). v3 auth is
  turned on too, with no user but root, so a tenant's certificate cannot use the v3 API at all.
- Every rendezvous id of a namespace starts with `tenant_prefix(namespace)`, and the namespace's
  role may touch only the keys of those ids: rendezvous_keys.py (pure: the renderer uses it too).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import secrets
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# the names and the key layout (pure: render.py uses them) live in rendezvous_keys.py; importable from here as before
from .rendezvous_keys import (  # noqa: F401 - re-exported
    CA_KEY,
    CERT_KEY,
    KEY_KEY,
    LEGACY_DIR,
    MOUNT_PATH,
    SHARED_DIRS,
    STATE_DIR,
    STATE_PREFIX,
    STORE_DIR,
    STORE_KEY_PREFIX,
    USER_PREFIX,
    legacy_prefix,
    permissions,
    rdzv_conf,
    secret_name,
    tenant_prefix,
    user_name,
)

log = logging.getLogger("llmtrain.operator")
ROOT_USER = "root"
# Long enough for any attempt (agents keep talking to etcd while they train: heartbeats); an
# identity is revoked by deleting its etcd user, not by expiry.
CERT_DAYS = 365
# A key only root may read or write: whether etcd is still the one this operator set up.
MARKER_PATH = "/v2/keys/llmtrain/rendezvous-auth"


@dataclass(frozen=True)
class Credentials:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: str | Path) -> Path:
        """The three files, as the pod's Secret volume lays them out."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        for name, data in ((CA_KEY, self.ca_pem), (CERT_KEY, self.cert_pem), (KEY_KEY, self.key_pem)):
            (d / name).write_bytes(data)
        return d

    def secret_data(self) -> dict[str, str]:
        return {
            k: base64.b64encode(v).decode()
            for k, v in ((CA_KEY, self.ca_pem), (CERT_KEY, self.cert_pem), (KEY_KEY, self.key_pem))
        }


class CertificateAuthority:
    """The rendezvous CA: the chart creates it (ca.crt, ca.key); the operator signs with it."""

    def __init__(self, cert_pem: bytes, key_pem: bytes):
        self.cert_pem = cert_pem
        self.cert = x509.load_pem_x509_certificate(cert_pem)
        self.key = serialization.load_pem_private_key(key_pem, password=None)

    @classmethod
    def from_dir(cls, directory: str | Path) -> CertificateAuthority:
        d = Path(directory)
        return cls((d / CA_KEY).read_bytes(), (d / "ca.key").read_bytes())

    @classmethod
    def generate(cls, common_name: str = "llmtrain-rendezvous-ca", days: int = 3650) -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def key_pem(self) -> bytes:
        return _key_pem(self.key)

    def issue(self, common_name: str, *, server_names: tuple[str, ...] = (), days: int = CERT_DAYS) -> Credentials:
        """A client certificate for `common_name` (the etcd user), or with `server_names` a
        server certificate for those DNS names / IP addresses."""
        import ipaddress

        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name else []))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server_names:
            sans: list[x509.GeneralName] = []
            for n in server_names:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(n)))
                except ValueError:
                    sans.append(x509.DNSName(n))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False).add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
        else:
            builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())  # type: ignore[arg-type]  # an EC key: generate() / load
        return Credentials(self.cert_pem, cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _tls_context(creds: Credentials) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=creds.ca_pem.decode())
    # load_cert_chain reads files only: they exist for the loading and no longer
    with tempfile.TemporaryDirectory(prefix="llmtrain-etcd-admin-") as tmp:
        cert, key = Path(tmp) / CERT_KEY, Path(tmp) / KEY_KEY
        cert.write_bytes(creds.cert_pem)
        key.write_bytes(creds.key_pem)
        ctx.load_cert_chain(cert, key)
    return ctx


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class EtcdAuthError(RuntimeError):
    pass


class EtcdAdmin:
    """etcd's auth API (v2 JSON over HTTPS, and v3 through its JSON gateway) as `root`."""

    def __init__(self, endpoint: str, ca: CertificateAuthority, timeout: float = 10.0):
        self.base = f"https://{endpoint}"
        self.timeout = timeout
        self._ctx = _tls_context(ca.issue(ROOT_USER))
        # etcd's v3 JSON gateway refuses a client certificate with a CommonName under
        # --client-cert-auth (it would not pass the name on), so v3 is set up with one without.
        self._v3_ctx = _tls_context(ca.issue(""))
        self._ready: set[str] = set()
        self._epoch: str | None = None

    def _call(
        self, method: str, path: str, body: dict | None = None, ok=(200, 201), ctx=None, form: dict | None = None
    ) -> tuple[int, dict]:
        data: bytes | None
        if form is not None:  # the v2 keys API takes form fields
            data, kind = urllib.parse.urlencode(form).encode(), "application/x-www-form-urlencoded"
        else:
            data, kind = (None if body is None else json.dumps(body).encode()), "application/json"
        req = urllib.request.Request(self.base + path, data=data, method=method, headers={"Content-Type": kind})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=ctx or self._ctx) as r:
                status, text = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read()
        if status not in ok:
            raise EtcdAuthError(f"etcd {method} {path}: HTTP {status}: {text[:300]!r}")
        try:
            return status, json.loads(text or b"{}")
        except ValueError:
            return status, {}

    def _names(self, path: str, field: str, key: str) -> list[str]:
        _, out = self._call("GET", path)
        return [item[key] for item in out.get(field) or [] if isinstance(item, dict) and key in item]

    def bootstrap(self) -> None:
        """Auth on (v2 and v3), root the only all-powerful user (its password reset to one nobody
        knows), guest allowed nothing, no users or roles but root's and the namespaces', each of
        those exactly as `ensure_namespace` makes it, and SHARED_DIRS permanent directories of
        root's. Idempotent.

        etcd found without auth (fresh, or restarted without its data: the chart's default data
        dir is an emptyDir) may hold anything a certificate holder wrote meanwhile, a pickle in a
        future run id's key included, so then users, roles and every rendezvous key are wiped
        first. The same when the marker this process wrote is gone or changed."""
        _, state = self._call("GET", "/v2/auth/enable")
        enabled = bool(state.get("enabled"))
        status, marker = self._call("GET", MARKER_PATH, ok=(200, 401, 403, 404))
        value = (marker.get("node") or {}).get("value") if status == 200 else None
        wipe = not enabled or value is None or (self._epoch is not None and value != self._epoch)
        users = self._names("/v2/auth/users", "users", "user")
        roles = self._names("/v2/auth/roles", "roles", "role")
        for u in users:
            stale = wipe or (u != ROOT_USER and not u.startswith(USER_PREFIX))
            if stale and (u != ROOT_USER or not enabled):  # root cannot go while auth is on
                self._call("DELETE", f"/v2/auth/users/{u}", ok=(200, 404))
        for r in roles:
            if r not in (ROOT_USER, "guest") and (wipe or not r.startswith(USER_PREFIX)):
                self._call("DELETE", f"/v2/auth/roles/{r}", ok=(200, 404))
        password = secrets.token_urlsafe(32)  # never used: root authenticates by certificate
        self._call("PUT", "/v2/auth/users/root", {"user": ROOT_USER, "password": password}, ok=(200, 201))
        if not enabled:
            # An empty guest role before enabling: otherwise EnableAuth creates one with r/w on /*.
            empty = {"role": "guest", "permissions": {"kv": {"read": [], "write": []}}}
            self._call("PUT", "/v2/auth/roles/guest", empty, ok=(200, 201, 409))
            self._empty_guest()
            self._call("PUT", "/v2/auth/enable", ok=(200, 201, 409))
        self._empty_guest()
        self._ready.clear()
        if wipe:
            for top in ("/v2/keys/torch", "/v2/keys/torchelastic"):
                self._call("DELETE", f"{top}?recursive=true", ok=(200, 404))
        else:
            for u in users:
                if u.startswith(USER_PREFIX):
                    self.ensure_namespace(u[len(USER_PREFIX) :])
        self._ensure_shared_dirs()
        self._bootstrap_v3()
        epoch = secrets.token_urlsafe(16)
        self._call("PUT", MARKER_PATH, form={"value": epoch})
        self._epoch = epoch

    def _ensure_shared_dirs(self) -> None:
        """SHARED_DIRS exist as permanent directories, made by root: torch never has to create
        them, so no tenant needs a grant on them. One found with a TTL (set through the
        LEGACY_DIR grant that identities held before legacy_prefix, and now revoked) is made
        permanent again, or it would take every namespace's keys under it when it expires."""
        for d in SHARED_DIRS:
            status, out = self._call("GET", f"/v2/keys{d}", ok=(200, 404))
            node = out.get("node") or {}
            if status == 200 and not node.get("dir"):  # a plain key: through that old grant, or by hand
                log.warning("etcd: %s was a key (index %s), not a directory: replaced", d, node.get("modifiedIndex"))
                self._call("DELETE", f"/v2/keys{d}", ok=(200, 404))
                status = 404
            elif status == 200 and ("ttl" in node or "expiration" in node):
                log.warning("etcd: %s was to expire at %s: made permanent", d, node.get("expiration"))
                # an empty ttl on an update makes the node permanent (404: it expired meanwhile)
                status, _ = self._call(
                    "PUT", f"/v2/keys{d}", ok=(200, 404), form={"dir": "true", "prevExist": "true", "ttl": ""}
                )
            if status == 404:
                self._call("PUT", f"/v2/keys{d}", ok=(200, 201, 412), form={"dir": "true", "prevExist": "false"})

    def _empty_guest(self) -> None:
        _, guest = self._call("GET", "/v2/auth/roles/guest")
        kv = (guest.get("permissions") or {}).get("kv") or {}
        if kv.get("read") or kv.get("write"):
            self._call(
                "PUT",
                "/v2/auth/roles/guest",
                {"role": "guest", "revoke": {"kv": {"read": kv.get("read") or [], "write": kv.get("write") or []}}},
            )

    def ensure_current(self) -> None:
        """Before each attempt: etcd still has auth on and the marker this process wrote (two
        reads); else `bootstrap` again."""
        status, marker = self._call("GET", MARKER_PATH, ok=(200, 401, 403, 404))
        if status != 200 or (marker.get("node") or {}).get("value") != self._epoch:
            self.bootstrap()

    def _bootstrap_v3(self) -> None:
        """v3 auth on with root the only user: a tenant's certificate names no v3 user, so etcd
        refuses its v3 requests (and it cannot fill the v3 keyspace's quota for everyone)."""

        def post(path: str, body: dict) -> str:
            status, out = self._call("POST", path, body, ok=(200, 400, 401, 403, 409, 412, 500), ctx=self._v3_ctx)
            return "" if status == 200 else json.dumps(out)

        err = post("/v3/auth/role/add", {"name": "root"})
        auth_on = ("user name is empty", "user name not found", "permission denied", "invalid auth token")
        if any(m in err for m in auth_on):
            return  # auth is on already: only an authenticated root could add a role
        if err and "already exists" not in err:
            raise EtcdAuthError(f"etcd v3 role add: {err[:300]}")
        for path, body in (
            ("/v3/auth/user/add", {"name": ROOT_USER, "password": secrets.token_urlsafe(32)}),
            ("/v3/auth/user/grant", {"user": ROOT_USER, "role": "root"}),
            ("/v3/auth/enable", {}),
        ):
            err = post(path, body)
            if err and "already exists" not in err:
                raise EtcdAuthError(f"etcd v3 {path}: {err[:300]}")

    def ensure_namespace(self, namespace: str) -> None:
        """The namespace's role (exactly `permissions`) and user, created or corrected."""
        if namespace in self._ready:
            return
        name, want = user_name(namespace), permissions(namespace)
        status, _ = self._call(
            "PUT", f"/v2/auth/roles/{name}", {"role": name, "permissions": {"kv": want}}, ok=(200, 201, 409)
        )
        if status == 409:
            _, role = self._call("GET", f"/v2/auth/roles/{name}")
            have = (role.get("permissions") or {}).get("kv") or {}
            grant = {k: sorted(set(want[k]) - set(have.get(k) or [])) for k in ("read", "write")}
            revoke = {k: sorted(set(have.get(k) or []) - set(want[k])) for k in ("read", "write")}
            if any(grant.values()):
                self._call("PUT", f"/v2/auth/roles/{name}", {"role": name, "grant": {"kv": grant}})
            if any(revoke.values()):
                self._call("PUT", f"/v2/auth/roles/{name}", {"role": name, "revoke": {"kv": revoke}})
        status, _ = self._call(
            "PUT",
            f"/v2/auth/users/{name}",
            {"user": name, "password": secrets.token_urlsafe(32), "roles": [name]},
            ok=(200, 201, 409),
        )
        if status == 409:
            _, user = self._call("GET", f"/v2/auth/users/{name}")
            roles = {r.get("role") if isinstance(r, dict) else r for r in user.get("roles") or []}
            if name not in roles:
                self._call("PUT", f"/v2/auth/users/{name}", {"user": name, "grant": [name]})
            if roles - {name}:  # e.g. root, granted while auth was off
                self._call("PUT", f"/v2/auth/users/{name}", {"user": name, "revoke": sorted(roles - {name})})
        self._ready.add(namespace)


def server_secret(namespace: str, service: str, name: str | None = None) -> dict:
    """The Secret the etcd chart mounts (auth.existingSecret, default <service>-tls): a new CA and
    etcd's server certificate for the Service's DNS names."""
    ca = CertificateAuthority.generate()
    names = (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    )
    server = ca.issue(service, server_names=names, days=3650)
    data = server.secret_data()
    data["ca.key"] = base64.b64encode(ca.key_pem()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name or f"{service}-tls",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "llmtrain"},
        },
        "data": data,
    }


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m llmtrain.rendezvous_auth",
        description="print the rendezvous CA + etcd server certificate Secret (JSON)",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("secret")
    s.add_argument("--namespace", required=True, help="the etcd release's namespace")
    s.add_argument("--service", required=True, help="the etcd Service name (e.g. llmtrain-etcd)")
    s.add_argument("--name", help="the Secret's name (default <service>-tls)")
    args = p.parse_args(argv)
    print(json.dumps(server_secret(args.namespace, args.service, args.name), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

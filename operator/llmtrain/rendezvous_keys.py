"""The names and the etcd key layout of the per-namespace rendezvous identities
(docs/operations/tenant-isolation.md); rendezvous_auth.py issues the identities and sets up etcd.
Pure: the renderer (render.py) uses the names and the mounted files' layout.

Every rendezvous id of a namespace starts with `tenant_prefix(namespace)`, which no other
namespace's ids can start with: namespaces are DNS labels, so the first "." ends the name.

The torch key layout the permissions follow (torch/distributed/elastic/rendezvous):
- etcd-v2 (dynamic rendezvous): the state at `/torch/elastic/rendezvous/<run_id>`; a key-value
  store under `/torch/elastic/store/` whose keys are base64(`torch.rendezvous.<run_id>.<round>/<k>`)
  (EtcdStore over a PrefixStore). The tenant prefix is padded with "." so that
  `torch.rendezvous.<prefix>` is a whole number of base64 groups: then every key of the namespace,
  and no other, starts with the base64 of it. The store is read as a directory (a GET and a
  recursive watch of `/torch/elastic/store/`), so every identity may *read* it: it holds rank 0's
  address and port of each run, no pickles; writes stay per namespace.
- etcd (the legacy backend): everything under `<etcd_prefix>/run_<run_id>`, after it creates the
  `<etcd_prefix>/` directory itself (EtcdRendezvous.__init__). Its default, `/torchelastic/p2p`, is
  shared by every namespace, and etcd v2 checks the exact key for a write to a directory (a TTL
  update of it too, which expires everything under it), so a grant there lets any namespace wipe
  every other's rendezvous. Each namespace's jobs get their own `etcd_prefix` instead
  (`legacy_prefix`, passed in --rdzv-conf): `/torchelastic/p2p/<prefix>`.

No tenant identity may write any key or directory shared between namespaces (SHARED_DIRS and their
parents): every write pattern is a shared directory and "/", then the namespace's prefix in the
form torch's keys carry it, then `*`. root creates the shared directories at bootstrap, permanent,
so nobody else ever needs to (etcd also creates a written key's missing parents itself, permanent).
tests/operator_core/test_rendezvous_permissions.py tries every write form on every such key.
"""

from __future__ import annotations

import base64

# The Secret a worker pod mounts (one per attempt, see secret_name) and its keys (kubernetes.io/tls
# plus the CA, as cert-manager lays them out).
CA_KEY, CERT_KEY, KEY_KEY = "ca.crt", "tls.crt", "tls.key"
MOUNT_PATH = "/etc/llmtrain/rendezvous"
STATE_DIR = "/torch/elastic/rendezvous"
STATE_PREFIX = STATE_DIR + "/"
STORE_DIR = "/torch/elastic/store"
STORE_KEY_PREFIX = "torch.rendezvous."
LEGACY_DIR = "/torchelastic/p2p"
# The directories the namespaces' keys live in, side by side: root's only.
SHARED_DIRS = (STATE_DIR, STORE_DIR, LEGACY_DIR)


def tenant_prefix(namespace: str) -> str:
    """What every rendezvous id of `namespace` starts with: the name, then 1-3 dots so that
    len("torch.rendezvous." + prefix) % 3 == 0 (see the module docstring)."""
    dots = 3 - (len(STORE_KEY_PREFIX) + len(namespace)) % 3
    return namespace + "." * dots


USER_PREFIX = "llmtrain-ns-"


def user_name(namespace: str) -> str:
    """The etcd user (and role) of a namespace: the CommonName of its certificates."""
    return f"{USER_PREFIX}{namespace}"


def secret_name(ptj_name: str) -> str:
    return f"{ptj_name}-rendezvous"


def legacy_prefix(namespace: str) -> str:
    """torch's `etcd_prefix` for the namespace's jobs on the legacy `etcd` backend: a directory of
    its own under LEGACY_DIR, which torch creates (and may write) without touching LEGACY_DIR."""
    return f"{LEGACY_DIR}/{tenant_prefix(namespace)}"


def permissions(namespace: str) -> dict[str, list[str]]:
    """v2 key permissions of the namespace's role: `pattern*` is a prefix, anything else exact.
    Writes: only keys under a shared directory that name the namespace's prefix (as torch's keys
    carry it) before the `*`, never a shared directory itself."""
    prefix = tenant_prefix(namespace)
    store = base64.b64encode((STORE_KEY_PREFIX + prefix).encode()).decode()
    own = [
        f"{STATE_PREFIX}{prefix}*",
        f"{STORE_DIR}/{store}*",
        f"{legacy_prefix(namespace)}*",
        # torch's default layout, `LEGACY_DIR/run_<run id>`: attempts started before legacy_prefix
        # keep renewing and writing their run directory until they end (docs/operations/upgrading.md).
        # No namespace's prefix starts with "run_" (DNS labels have no "_").
        f"{LEGACY_DIR}/run_{prefix}*",
    ]
    return {"read": sorted([*own, STORE_DIR, f"{STORE_DIR}/*"]), "write": sorted(own)}


def rdzv_conf(backend: str, namespace: str, directory: str = MOUNT_PATH) -> str:
    """torchrun's --rdzv-conf for `namespace`'s credentials mounted at `directory` (the two etcd
    backends name the same three files differently; the legacy one also gets its etcd_prefix)."""
    ca, cert, key = (f"{directory}/{k}" for k in (CA_KEY, CERT_KEY, KEY_KEY))
    if backend == "etcd-v2":
        return f"protocol=https,ca_cert={ca},ssl_cert={cert},ssl_cert_key={key}"
    if backend == "etcd":
        return f"protocol=https,cacert={ca},cert={cert},key={key},etcd_prefix={legacy_prefix(namespace)}"
    raise ValueError(f"no etcd credentials for the {backend} backend")

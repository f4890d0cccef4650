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
- etcd (the legacy backend): everything under `/torchelastic/p2p/run_<run_id>`, after it creates
  the `/torchelastic/p2p/` directory itself.
"""

from __future__ import annotations

import base64

# The Secret a worker pod mounts (one per attempt, see secret_name) and its keys (kubernetes.io/tls
# plus the CA, as cert-manager lays them out).
CA_KEY, CERT_KEY, KEY_KEY = "ca.crt", "tls.crt", "tls.key"
MOUNT_PATH = "/etc/llmtrain/rendezvous"
STATE_PREFIX = "/torch/elastic/rendezvous/"
STORE_DIR = "/torch/elastic/store"
STORE_KEY_PREFIX = "torch.rendezvous."
LEGACY_DIR = "/torchelastic/p2p"


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


def permissions(namespace: str) -> dict[str, list[str]]:
    """v2 key permissions of the namespace's role: `pattern*` is a prefix, anything else exact."""
    prefix = tenant_prefix(namespace)
    store = base64.b64encode((STORE_KEY_PREFIX + prefix).encode()).decode()
    own = [f"{STATE_PREFIX}{prefix}*", f"{STORE_DIR}/{store}*", f"{LEGACY_DIR}/run_{prefix}*"]
    return {"read": sorted([*own, STORE_DIR, f"{STORE_DIR}/*"]), "write": sorted([*own, LEGACY_DIR, f"{LEGACY_DIR}/"])}


def rdzv_conf(backend: str, directory: str = MOUNT_PATH) -> str:
    """torchrun's --rdzv-conf for the credentials mounted at `directory` (the two etcd backends
    name the same three files differently)."""
    ca, cert, key = (f"{directory}/{k}" for k in (CA_KEY, CERT_KEY, KEY_KEY))
    if backend == "etcd-v2":
        return f"protocol=https,ca_cert={ca},ssl_cert={cert},ssl_cert_key={key}"
    if backend == "etcd":
        return f"protocol=https,cacert={ca},cert={cert},key={key}"
    raise ValueError(f"no etcd credentials for the {backend} backend")

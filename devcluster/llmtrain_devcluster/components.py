"""The command lines of the dev cluster's components: what each one runs with, and why.

Pure functions of ports, paths and binaries; starting and supervising them is :mod:`.process`'s
job and ordering them is :class:`~.cluster.DevCluster`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"

# Controllers that need nodes, a cloud provider or volumes/kubelets; they only add noise here.
# Everything else stays on (garbage-collector, namespace, serviceaccount, serviceaccount-token,
# root-ca-certificate-publisher, replicaset, deployment, job, ...), and so does the
# persistentvolume-binder: it binds a claim to the local PersistentVolume that the real node's pods
# mount (node/volumes.py).
DISABLED_CONTROLLERS = (
    "cloud-node-lifecycle-controller",
    "node-ipam-controller",
    "node-lifecycle-controller",
    "node-route-controller",
    "service-lb-controller",
    "persistentvolume-attach-detach-controller",
    "persistentvolume-expander-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
    "ephemeral-volume-controller",
    "taint-eviction-controller",
)


def etcd_argv(etcd: Path, data_dir: Path, client_url: str, peer_url: str, *, enable_v2: bool) -> list:
    """A single-member etcd; ``enable_v2`` turns on the v2 API torch's etcd rendezvous speaks."""
    return [
        etcd,
        "--name=default",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=default={peer_url}",
        "--initial-cluster-state=new",
        f"--enable-v2={'true' if enable_v2 else 'false'}",
        "--log-level=warn",
        "--logger=zap",
    ]


def apiserver_argv(
    apiserver: Path, *, etcd_url: str, port: int, pki: Path, verbosity: int, kubelet_client: bool = False
) -> list:
    """``kubelet_client``: the API server calls kubelets (``kubectl logs``/``exec`` on the real node)
    with its own client certificate and checks theirs against the cluster CA, at their InternalIP
    (the real node's bridge address): the kubelet then needs no anonymous access."""
    p = pki
    kubelet = [
        f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={p / 'ca.crt'}",
        "--kubelet-preferred-address-types=InternalIP",
    ]
    return [
        apiserver,
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={p / 'apiserver.crt'}",
        f"--tls-private-key-file={p / 'apiserver.key'}",
        f"--client-ca-file={p / 'ca.crt'}",
        "--authorization-mode=Node,RBAC",
        f"--service-account-issuer={SA_ISSUER}",
        f"--service-account-key-file={p / 'sa.pub'}",
        f"--service-account-signing-key-file={p / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
        # No real nodes: don't try to publish 127.0.0.1 as the kubernetes service endpoint.
        "--endpoint-reconciler-type=none",
        # 1.36 (like 1.34 on) serves resourceVersion=0 watches (kwok's, client-go's) as WatchList
        # streams, which etcd 3.4 cannot serve: they hang. Plain list+watch works everywhere.
        "--feature-gates=WatchList=false",
        # Otherwise every new Node gets node.kubernetes.io/not-ready:NoSchedule, which only
        # the node-lifecycle controller (off here: no kubelets) would remove.
        "--disable-admission-plugins=TaintNodesByCondition",
        "--allow-privileged=true",
        "--profiling=false",
        *(kubelet if kubelet_client else []),
        f"--v={verbosity}",
    ]


def controller_manager_argv(
    cm: Path, *, kubeconfig: Path, port: int, cert_dir: Path, pki: Path, verbosity: int, extra: Sequence[str] = ()
) -> list:
    p = pki
    return [
        cm,
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        "--leader-elect=false",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={p / 'sa.key'}",
        f"--root-ca-file={p / 'ca.crt'}",
        f"--cluster-signing-cert-file={p / 'ca.crt'}",
        f"--cluster-signing-key-file={p / 'ca.key'}",
        "--controllers=*," + ",".join(f"-{c}" for c in DISABLED_CONTROLLERS),
        f"--v={verbosity}",
        *extra,  # after the defaults: a later flag wins
    ]


def scheduler_argv(scheduler: Path, *, kubeconfig: Path, port: int, verbosity: int) -> list:
    kc = kubeconfig
    return [
        scheduler,
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--leader-elect=false",
        f"--v={verbosity}",
    ]


def training_operator_argv(
    to: Path, *, probe_port: int, metrics_port: int, webhook_port: int, extra: Sequence[str] = ()
) -> list:
    """Only the PyTorchJob controller; ``extra`` e.g. ``["--controller-threads=4"]``."""
    return [
        to,
        "--enable-scheme=pytorchjob",
        f"--health-probe-bind-address=127.0.0.1:{probe_port}",
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",
        # controller-runtime binds the webhook server on all interfaces; no flag for the host.
        f"--webhook-server-port={webhook_port}",
        *extra,
    ]


def kwok_argv(kwok: Path, *, kubeconfig: Path, config: Path) -> list:
    return [kwok, f"--kubeconfig={kubeconfig}", f"--config={config}"]

"""The chain's controllers started on a running control plane, in this order: kube-scheduler, the
training-operator, the JobSet controller, kwok and its nodes, then (``kueue=True``) Kueue.

Each is one of the cluster's supervised processes (:mod:`.supervisor`), started on free loopback
ports and polled on its own readiness endpoint, and records its endpoints in the cluster's
``cluster.json``. A component that registers webhooks registers them only once it serves them: a
registered webhook nobody answers fails the writes it covers. What each one's command line and
configuration hold is its own module's (:mod:`.components`, :mod:`.chain`,
:mod:`.training_operator`, :mod:`.jobset`, :mod:`.kueue`); this module wires them to a cluster.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import yaml

from . import certs, components, training_operator, webhooks
from . import chain as chain_mod
from . import jobset as jobset_mod
from . import kueue as kueue_mod
from .process import free_port, http_get
from .tools import find_tool, kwok_stages_dir

if TYPE_CHECKING:
    from .cluster import DevCluster

__all__ = ["start"]


def start(cluster: DevCluster, timeout: float) -> None:
    """Start the chain of ``cluster`` (its control plane up, its CRDs installed)."""
    _start_scheduler(cluster, timeout)
    _start_training_operator(cluster, timeout)
    _start_jobset(cluster, timeout)
    _start_kwok(cluster, timeout)
    cluster.add_nodes(cluster.nodes, timeout=timeout)
    if cluster.kueue:
        _start_kueue(cluster, timeout)


def _start_kueue(cluster: DevCluster, timeout: float) -> None:
    """Kueue's CRDs, the controller, then its webhook configurations (once it serves them), then
    the queues."""
    from kubernetes import client

    home = kueue_mod.kueue_dir()
    cluster.install_crds(kueue_mod.crd_paths(), timeout=timeout)
    with cluster.api_client() as api:
        try:
            client.CoreV1Api(api).create_namespace({"metadata": {"name": kueue_mod.NAMESPACE}})
        except client.ApiException as e:
            if e.status != 409:
                raise
    kdir = cluster.state_dir / "kueue"
    certs_dir = kdir / "serving-certs"
    ca = certs.load_ca(cluster.pki_dir)
    kueue_mod.write_serving_cert(ca, certs_dir)
    webhook, probe = free_port(), free_port()
    cfg = kdir / "config.yaml"
    cfg.write_text(
        kueue_mod.config_yaml(
            webhook_port=webhook, probe_port=probe, cert_dir=certs_dir, frameworks=cluster.kueue_frameworks
        )
    )
    cluster.processes.start(
        "kueue",
        kueue_mod.argv_with_metrics_cert(
            kdir,
            [
                find_tool("kueue"),
                f"--config={cfg}",
                f"--kubeconfig={cluster.kubeconfig}",
                # its on-demand visibility API server would need an APIService and more certs
                "--feature-gates=VisibilityOnDemand=false",
            ],
            ca,
        ),
        lambda: http_get(f"http://127.0.0.1:{probe}/readyz")[0] == 200,
        timeout,
    )
    hooks = kueue_mod.webhook_configurations(
        (home / "webhook" / "manifests.yaml").read_text(),
        url=f"https://127.0.0.1:{webhook}",
        ca_pem=(cluster.pki_dir / "ca.crt").read_bytes(),
        frameworks=cluster.kueue_frameworks,
    )
    objs = [
        *hooks,
        *([kueue_mod.topology()] if cluster.kueue_topology else []),
        *kueue_mod.resource_flavors(cluster.nodes, topology_aware=cluster.kueue_topology),
        kueue_mod.cluster_queue(cluster.nodes),
    ]
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(objs))
    cluster.update_info(kueue_webhook=f"https://127.0.0.1:{webhook}", kueue_frameworks=list(cluster.kueue_frameworks))


def _start_jobset(cluster: DevCluster, timeout: float) -> None:
    """The JobSet controller, then its webhook configurations once it serves them (its CRD is
    one of every cluster's, :func:`.crds.default_crds`)."""
    d = cluster.state_dir / "jobset"
    cert_dir = webhooks.write_serving_cert(certs.load_ca(cluster.pki_dir), d / "serving-certs", jobset_mod.NAME)
    probe, webhook = free_port(), free_port()
    cfg = d / "config.yaml"
    config = jobset_mod.config(probe_port=probe, webhook_port=webhook, cert_dir=cert_dir)
    cfg.write_text(yaml.safe_dump(config, sort_keys=False))
    cluster.processes.start(
        jobset_mod.NAME,
        jobset_mod.argv(find_tool(jobset_mod.NAME), config_file=cfg, probe_port=probe),
        lambda: http_get(f"http://127.0.0.1:{probe}/readyz")[0] == 200,
        timeout,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
    )
    url = f"https://127.0.0.1:{webhook}"
    cluster.apply(jobset_mod.webhook_configurations(url, (cluster.pki_dir / "ca.crt").read_bytes()))
    cluster.update_info(jobset_webhook=url)


def _start_scheduler(cluster: DevCluster, timeout: float) -> None:
    port = free_port()
    insecure = certs.insecure_ssl_context()  # its self-signed serving cert
    cluster.processes.start(
        "kube-scheduler",
        components.scheduler_argv(
            find_tool("kube-scheduler"),
            kubeconfig=cluster.state_dir / "scheduler.kubeconfig",
            port=port,
            verbosity=cluster.verbosity,
        ),
        lambda: http_get(f"https://127.0.0.1:{port}/healthz", context=insecure) == (200, "ok"),
        timeout,
    )
    cluster.update_info(scheduler=f"https://127.0.0.1:{port}")


def _start_training_operator(cluster: DevCluster, timeout: float) -> None:
    to_bin = find_tool("training-operator")
    to_env, to_args = cluster.prepare_training_operator()
    probe, metrics, webhook = free_port(), free_port(), free_port()
    cluster.processes.start(
        "training-operator",
        training_operator.argv(
            cluster.state_dir,
            components.training_operator_argv(
                to_bin,
                probe_port=probe,
                metrics_port=metrics,
                webhook_port=webhook,
                extra=[*to_args, *cluster.training_operator_args],
            ),
            kubeconfig=cluster.kubeconfig,
        ),
        lambda: http_get(f"http://127.0.0.1:{probe}/readyz")[0] == 200,
        timeout,
        env=to_env,
    )
    cluster.update_info(training_operator_metrics=f"http://127.0.0.1:{metrics}/metrics")


def _start_kwok(cluster: DevCluster, timeout: float) -> None:
    kwok_bin = find_tool("kwok")
    stages = kwok_stages_dir()
    kwok_dir = cluster.state_dir / "kwok"
    kwok_dir.mkdir(parents=True, exist_ok=True)
    kport = free_port()
    cfg = kwok_dir / "kwok.yaml"
    cfg.write_text(chain_mod.kwok_config(stages, server_address=f"127.0.0.1:{kport}"))
    env = {**os.environ, "KWOK_WORKDIR": str(kwok_dir)}  # no ~/.kwok config mixed in
    cluster.processes.start(
        "kwok",
        components.kwok_argv(kwok_bin, kubeconfig=cluster.kubeconfig, config=cfg),
        lambda: http_get(f"http://127.0.0.1:{kport}/healthz")[0] == 200,
        timeout,
        env=env,
    )
    cluster.update_info(kwok=f"http://127.0.0.1:{kport}")

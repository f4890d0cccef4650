"""Operator settings, from the command line (`__main__` builds them and the Operator)."""

from __future__ import annotations

from dataclasses import dataclass

from ..render import METRICS_PORT
from ..spec import DEFAULT_ETCD_ENDPOINT


@dataclass
class OperatorConfig:
    default_etcd_endpoint: str | None = DEFAULT_ETCD_ENDPOINT
    trainer_metrics_port: int = METRICS_PORT
    progress_interval: float = 30.0
    workers: int = 32
    scrape_timeout: float = 3.0
    # scrapes in flight at once (each is a coroutine on the event loop, not a thread)
    max_concurrent_scrapes: int = 200
    # taint nodes blamed for a failure llmtrain.dev/suspect=<reason>:NoSchedule, on at most this
    # fraction of the nodes of their instance type (0: never; controller/nodes.py)
    suspect_taint_fraction: float = 0.0


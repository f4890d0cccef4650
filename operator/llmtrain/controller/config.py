"""Operator settings, set once from the command line before kopf starts."""

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


CONFIG = OperatorConfig()

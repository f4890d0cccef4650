"""The monitor of Running attempts, on kopf's event loop: rank 0's /metrics → status.progress,
and the scrape as a fact for decide's health rules (caches.ProgressFacts). It writes only
status.progress, and only while the job is Running (the write that ends a job leaves the final
progress: ending.py), and never restarts anything: the progress write's watch event brings the
job to the reconciler, whose decide() judges hangs, NaN losses and spikes on the new facts.

Thousands of running jobs cost coroutines, not threads, and nothing here delays a new job's child:
blocking API calls run on the monitor's own pool, never on the reconciler's workers.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import aiohttp

from ... import backends
from ...pod_contract import child_name
from ...spec import TrainingSpec
from ..policy.progress import GOODPUT_KEYS, eta, timestamp
from . import owners, scrape
from .clock import now
from .observe import child_of, is_kind

if TYPE_CHECKING:
    from ..operator import Operator

log = logging.getLogger("llmtrain.operator")


def rank0_ip(pods: list[dict]) -> str | None:
    """IP of the attempt's first worker pod (index 0: the backend's rank label), where local rank 0
    serves metrics."""
    for pod in sorted(pods, key=lambda p: (p.get("index") or "~", p["name"])):
        if pod.get("ip"):
            return pod["ip"]
    return None


class Monitor:
    def __init__(self, op: Operator):
        self.op = op
        self._pool: ThreadPoolExecutor | None = None
        self._scrapes: asyncio.Semaphore | None = None
        self._http: aiohttp.ClientSession | None = None
        self._running: set[tuple[str, str]] = set()  # monitors in flight (event loop only)
        self._last: dict[tuple[str, str], float] = {}  # when each job's monitor last started
        self._guard = threading.Lock()

    def forget(self, key: tuple[str, str]) -> None:
        with self._guard:
            self._last.pop(key, None)

    def schedule(self, job: dict) -> None:
        """From a worker: run the job's monitor on the event loop, at most once per
        --progress-interval and never two at once for a job (a slow scrape does not pile up)."""
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        loop = self.op.loop
        with self._guard:
            at = time.monotonic()
            if at - self._last.get(key, -1e9) < self.op.config.progress_interval * 0.9 or loop is None:
                return
            self._last[key] = at
        asyncio.run_coroutine_threadsafe(self.monitor(job), loop)

    async def _in_pool(self, fn, *args):
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="llmtrain-monitor")
        ctx = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self._pool, ctx.run, fn, *args)

    async def scrape_progress(self, ip: str):
        """rank 0's /metrics → Progress, or None; at most config.max_concurrent_scrapes at once,
        each bounded by config.scrape_timeout and in size (scrape.py: the body is the tenant's),
        all on the event loop (an idle connection costs no thread)."""
        config = self.op.config
        if self._scrapes is None:
            self._scrapes = asyncio.Semaphore(config.max_concurrent_scrapes)
        if self._http is None or self._http.closed:
            self._http = scrape.session(config.scrape_timeout)
        async with self._scrapes:
            return await scrape.scrape(self._http, f"http://{ip}:{config.trainer_metrics_port}/metrics")

    async def monitor(self, job: dict) -> None:
        meta = job["metadata"]
        key = (meta["namespace"], meta["name"])
        if key in self._running:
            return
        self._running.add(key)
        try:
            await self.check_progress(job)
        except Exception:
            log.exception("monitor of %s/%s failed", *key)
        finally:
            self._running.discard(key)

    async def _rank0_ip(self, namespace: str, name: str, uid: str, attempt: int, backend: str | None) -> str | None:
        """Rank 0's pod among the attempt's own (owners.py: the uid chain to the job's child)."""
        b = backends.BACKENDS.get(backend or backends.DEFAULT_BACKEND)
        obj = self.op.attempts.of(namespace, name).get(child_name(name, attempt))
        if b is None or obj is None or not is_kind(obj, b):
            return None
        child = child_of(obj, uid, b)
        if not child.owned:
            return None
        trusted = self.op.owners.cached(b, namespace, child)
        if trusted is None:  # a read (a JobSet's Job): on the pool, not the event loop
            trusted = await self._in_pool(self.op.owners.of, b, namespace, child)
        return rank0_ip(owners.trusted(self.op.pods.of(namespace, name, attempt), trusted))

    async def check_progress(self, job: dict) -> None:
        meta, status = job["metadata"], job.get("status") or {}
        namespace, name, attempt = meta["namespace"], meta["name"], status.get("attempt") or 1
        ip = await self._rank0_ip(namespace, name, meta.get("uid") or "", attempt, status.get("backend"))
        progress = await self.scrape_progress(ip) if ip else None
        if progress is None:
            return  # the time rules (hang, no first step) are judged at the reconciler's next look
        previous = dict(status.get("progress") or {})
        if previous.get("attempt") != attempt:  # the last attempt's counters are not this one's
            for key in GOODPUT_KEYS:
                previous.pop(key, None)
        current = {**previous, **progress.as_status(), "attempt": attempt}
        at = now()
        max_steps = ((job.get("spec") or {}).get("training") or {}).get("maxSteps")
        if not isinstance(max_steps, int) or isinstance(max_steps, bool):
            max_steps = TrainingSpec.model_fields["max_steps"].default
        current.update(eta(current, previous, max_steps, at))
        current["updateTime"] = timestamp(at)
        self.op.progress.put(namespace, name, attempt, progress)
        written = await self._in_pool(self.op.kube.patch_running_progress, namespace, name, current)
        if written is not None:
            self.op.queue.add((namespace, name), written)  # decide judges the new facts

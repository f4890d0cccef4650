"""Leader election on a coordination.k8s.io/v1 Lease, the way client-go's leaderelection does it.

Only the replica holding the Lease runs the handlers at all; the others wait, serving /healthz so
their probes pass. Rules (client-go's):
  * a replica takes the Lease when nobody holds it, or when the holder's record has not changed for
    leaseDurationSeconds *as this replica observed it* (its own monotonic clock, so clock skew
    between nodes does not matter);
  * every read-modify-write is conditional on the resourceVersion read: two standbys can never both
    take it;
  * the leader renews every `retry` seconds; if it cannot renew for `renew_deadline` seconds
    (shorter than the lease) it stops acting at once (the process exits and its pod restarts as a
    standby), so it is gone before anyone else may take over: no stale writes after a failover;
  * on a clean shutdown the leader releases the Lease, so the standby takes over immediately.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass

import kubernetes
from kubernetes.client.exceptions import ApiException

from . import kube

log = logging.getLogger("llmtrain.leader")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class LeaseConfig:
    name: str
    namespace: str
    identity: str
    lease_seconds: float = 10.0
    renew_deadline: float = 6.0
    retry: float = 1.0


class LeaderElector:
    def __init__(self, config: LeaseConfig):
        self.config = config
        self._observed: tuple[str | None, str | None] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0  # monotonic time it was first seen
        self._stop = threading.Event()

    def _api(self) -> kubernetes.client.CoordinationV1Api:
        return kubernetes.client.CoordinationV1Api(kube._client())

    def _record(self, transitions: int, acquire_time: dt.datetime | None) -> dict:
        c = self.config
        return {
            "holderIdentity": c.identity,
            "leaseDurationSeconds": round(c.lease_seconds),
            "acquireTime": acquire_time or _now(),
            "renewTime": _now(),
            "leaseTransitions": transitions,
        }

    def try_acquire_or_renew(self) -> bool:
        """One round: True when this replica holds the Lease afterwards."""
        c, api = self.config, self._api()
        try:
            lease = api.read_namespaced_lease(c.name, c.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            meta = kubernetes.client.V1ObjectMeta(name=c.name, namespace=c.namespace)
            body = kubernetes.client.V1Lease(metadata=meta, spec=self._record(0, None))
            try:
                api.create_namespaced_lease(c.namespace, body)
                return True
            except ApiException as err2:
                if err2.status == 409:
                    return False
                raise
        spec = lease.spec
        holder = spec.holder_identity or None
        seen = (holder, str(spec.renew_time))
        if seen != self._observed:
            self._observed, self._observed_at = seen, time.monotonic()
        duration = spec.lease_duration_seconds or c.lease_seconds
        expired = holder is None or time.monotonic() - self._observed_at > duration
        if holder != c.identity and not expired:
            return False
        transitions = (spec.lease_transitions or 0) + (0 if holder == c.identity else 1)
        lease.spec = kubernetes.client.V1LeaseSpec(
            **self._record(transitions, spec.acquire_time if holder == c.identity else None)
        )
        try:  # replace carries the resourceVersion read: a concurrent change makes it 409
            updated = api.replace_namespaced_lease(c.name, c.namespace, lease)
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        self._observed, self._observed_at = (c.identity, str(updated.spec.renew_time)), time.monotonic()
        return True

    def wait_until_leader(self) -> None:
        log.info("waiting to acquire lease %s/%s as %s", self.config.namespace, self.config.name, self.config.identity)
        while not self._stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    log.info("acquired lease %s/%s", self.config.namespace, self.config.name)
                    return
            except Exception as err:  # noqa: BLE001 — an API hiccup: try again next round
                log.warning("lease round failed: %s", err)
            self._stop.wait(self.config.retry)

    def keep_renewing(self, on_lost) -> threading.Thread:
        """Renew in a thread; call `on_lost()` when the lease was not renewed for renew_deadline."""

        def loop():
            last_ok = time.monotonic()
            while not self._stop.wait(self.config.retry):
                try:
                    ok = self.try_acquire_or_renew()
                except Exception as err:  # noqa: BLE001 - logged; the lease is lost until a renewal works
                    log.warning("lease renewal failed: %s", err)
                    ok = False
                if ok:
                    last_ok = time.monotonic()
                elif time.monotonic() - last_ok > self.config.renew_deadline or self._lost_to_other():
                    log.error("lost lease %s/%s; stopping", self.config.namespace, self.config.name)
                    on_lost()
                    return

        thread = threading.Thread(target=loop, name="lease-renewer", daemon=True)
        thread.start()
        return thread

    def _lost_to_other(self) -> bool:
        return self._observed is not None and self._observed[0] not in (None, self.config.identity)

    def release(self) -> None:
        """Give the Lease up (clean shutdown) so a standby need not wait for it to expire."""
        self._stop.set()
        c, api = self.config, self._api()
        try:
            lease = api.read_namespaced_lease(c.name, c.namespace)
            if lease.spec.holder_identity != c.identity:
                return
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = _now()
            api.replace_namespaced_lease(c.name, c.namespace, lease)
            log.info("released lease %s/%s", c.namespace, c.name)
        except ApiException as err:
            log.warning("could not release the lease: %s", err)

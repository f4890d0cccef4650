"""Child creates paced by their controller's progress.

A backend whose controller reconciles with one worker (JobSet v0.12's has no concurrency setting)
falls behind when the operator hands it children faster than it takes them up, and when every
create also lands on the API server during a user's burst it all but stops: at 1,000 jobs created
in 25 s it made 1.4 Jobs a second while the creates went on, then 14-20 a second
(docs/performance/operator-scale.md). So the operator keeps at most `limit` of its own children
that their controller has not taken up yet (`Backend.taken_up`: its first status write, made in the
reconcile that created the child's Jobs). A create beyond that is held: the job's reconcile ends
without a write (a new job keeps an empty status until its turn), and it waits in line to be woken when
a child ahead is taken up, deleted or given up on. The namespaces take turns, first come first
served within each: one tenant's burst of a thousand jobs does not keep another's one job waiting
behind it (JobSet's own queue is one line for all).

A child its controller has not taken up within `ttl` seconds stops counting (a stopped or
missing controller slows creates to `limit` per `ttl`, never stops them); so does one whose create
did not make it. Suspended children count like the rest: JobSet's controller takes a suspended
JobSet up too (it makes its Jobs suspended and writes its status). After an operator restart only
this process's creates count, so the first window may overlap the last one's.

Measured at 1,000 jobs on 500 simulated nodes (docs/performance/operator-scale.md, "Pacing JobSet
creates"): the user's create call 3x faster, JobSet -> Job in seconds instead of ~40 s, and with
kube-controller-manager at Kubernetes' default 20 QPS within 3-6% of Kubeflow Trainer v2 (from
5-20% behind); at 100 QPS it costs ~5% jobs/s (JobSet's controller, fed a few at a time, makes 9-11 Jobs
a second where after an unpaced burst it reaches 14-20). `--max-children-untaken=0` turns it off.

Only the line's head gets a timer (the next expiry): the rest move up as it moves, so a held burst
costs one reconcile per job when its turn comes, not one per job per tick.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator

UNTAKEN_TTL = 30.0  # seconds a created child counts against the limit while its controller is silent


def _tenant(job: Hashable) -> Hashable:
    return job[0] if isinstance(job, tuple) and job else job  # a (namespace, name) key's namespace


class CreatePacer:
    def __init__(
        self,
        limit: int,
        wake: Callable[[Hashable], None],
        ttl: float = UNTAKEN_TTL,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.limit, self._wake, self._ttl, self._clock = limit, wake, ttl, clock
        self._lock = threading.Lock()
        self._untaken: dict[Hashable, float] = {}  # child key → when it stops counting
        # held jobs per namespace, first come first; the namespaces take turns in this dict's order
        # (as in the work queue): one that was just served moves to its end
        self._line: OrderedDict[Hashable, OrderedDict[Hashable, None]] = OrderedDict()
        self._woken: set[Hashable] = set()  # in line and woken, not yet run again

    def admit(self, job: Hashable, child: Hashable) -> bool:
        """May `job` create `child` now? True reserves its slot until the child is taken up."""
        if self.limit <= 0:
            return True
        with self._lock:
            now = self._clock()
            freed = self._expire(now)
            free = self.limit - len(self._untaken)
            self._join(job)  # a newcomer takes its place in line: it never jumps it
            ok = free > 0 and job in itertools.islice(self._order(), free)
            self._woken.discard(job)  # admitted, or woken too early (the slot went): woken again in turn
            if ok:
                self._leave(job)
                if _tenant(job) in self._line:  # its next job waits for the other namespaces' turns
                    self._line.move_to_end(_tenant(job))
                self._untaken[child] = now + self._ttl
            wake = self._release() if freed else []
        self._wake_all(wake)
        return ok

    def recheck_in(self, job: Hashable) -> float | None:
        """A held job's requeue: the line's head looks again when the next slot expires (woken
        sooner if a child is taken up); the others are woken as the line moves."""
        with self._lock:
            if next(self._order(), None) != job or not self._untaken:
                return None
            return max(0.05, min(self._untaken.values()) - self._clock())

    def leave(self, job: Hashable) -> None:
        """`job`'s run ended without being held (it created, or had nothing to create): out of line."""
        with self._lock:
            if not self._leave(job):
                return
            wake = self._release()
        self._wake_all(wake)

    forget = leave  # the job was deleted

    def taken(self, child: Hashable) -> None:
        """`child` no longer counts: its controller took it up, it was deleted, or its create did
        not make it."""
        with self._lock:
            if self._untaken.pop(child, None) is None:
                return
            wake = self._release()
        self._wake_all(wake)

    def counts(self) -> tuple[int, int]:
        """(children not taken up, jobs held)."""
        with self._lock:
            return len(self._untaken), sum(len(line) for line in self._line.values())

    # --- under the lock ---

    def _join(self, job: Hashable) -> None:
        tenant = _tenant(job)
        line = self._line.setdefault(tenant, OrderedDict())
        line.setdefault(job, None)

    def _leave(self, job: Hashable) -> bool:
        tenant = _tenant(job)
        line = self._line.get(tenant)
        if line is None or job not in line:
            return False
        del line[job]
        self._woken.discard(job)
        if not line:
            del self._line[tenant]
        return True

    def _order(self) -> Iterator[Hashable]:
        """The held jobs in the order slots go to them: each namespace's first, in turn, then each
        one's second...: one tenant's burst does not keep another's job waiting behind it."""
        iters = [iter(line) for line in self._line.values()]
        while iters:
            going = []
            for it in iters:
                job = next(it, None)
                if job is not None:
                    yield job
                    going.append(it)
            iters = going

    def _expire(self, now: float) -> bool:
        stale = [c for c, until in self._untaken.items() if until <= now]
        for c in stale:
            del self._untaken[c]
        return bool(stale)

    def _release(self) -> list[Hashable]:
        """The jobs at the line's front that a free slot awaits, not woken yet."""
        free = self.limit - len(self._untaken)
        wake = [j for j in itertools.islice(self._order(), max(free, 0)) if j not in self._woken]
        self._woken.update(wake)
        return wake

    def _wake_all(self, jobs: list[Hashable]) -> None:
        for job in jobs:
            self._wake(job)

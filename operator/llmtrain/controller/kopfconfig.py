"""kopf's settings for this operator, and what of kopf's per-event machinery it turns off.

The watch layer (watch.py) registers only `on.event` handlers: kopf delivers watch events and
stores nothing on our objects. kopf still prepares, for every watch event of every
object, the "diff base" that change handlers (`on.create/update/resume`) compare against: a
deepcopy of the whole body, cleaned of kopf's own annotations twice (old and new). Nothing reads it
without change or spawning (daemon/timer) handlers, and under the 1,000-job benchmark it was the
largest single piece of the operator's CPU: about a fifth of the time the process held the GIL
(py-spy --gil), on the one event loop every watch event goes through. `NoDiffBase` skips it; it is
only installed while no change or spawning handler is registered (a later one gets kopf's own).
"""

from __future__ import annotations

import logging

import kopf


class NoDiffBase(kopf.DiffBaseStorage):
    """A diff base for an operator without change handlers: nothing stored, nothing built."""

    def build(self, *, body, extra_fields=None):
        return None  # kopf then skips its progress-annotation cleaning and diffs nothing

    def fetch(self, *, body):
        return None

    def store(self, *, body, patch, essence):
        return None


def needs_diff_base(registry) -> bool:
    """True if any registered handler compares an object with its last handled state (kopf's
    change handlers; daemons and timers use the diff to reset their idle time)."""
    return bool(registry._changing.get_all_handlers() or registry._spawning.get_all_handlers())


def apply(settings: kopf.OperatorSettings, registry=None) -> None:
    registry = registry if registry is not None else kopf.get_default_registry()
    settings.posting.level = logging.INFO
    # Post only the events the handlers mean to (Created, Restarting, InvalidSpec...), not a
    # "Logging" event for every handler and timer run: at 1,000 running jobs those were most of
    # the operator's API requests.
    settings.posting.loggers = False
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    # kopf runs no sync handler of ours (the reconciler has its own workers, --workers).
    settings.execution.max_workers = 4
    # (No settings.batching.batch_window: kopf 1.45 handles each event at once and warns that the
    # setting does nothing.)
    # No other persistence settings: only on.event handlers are registered, so kopf
    # stores no progress, no diff base and no finalizer on our objects (level-triggered
    # reconciler, reconciler.py); spec changes are seen as metadata.generation moving past
    # status.observedGeneration.
    if not needs_diff_base(registry):
        settings.persistence.diffbase_storage = NoDiffBase()

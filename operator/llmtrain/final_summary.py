"""The trainer's final summary: the termination message a worker pod leaves when it exits 0.

While a job runs, the operator scrapes rank 0's /metrics every --progress-interval; the last scrape
of a job that ends is up to one interval old (the demo's 40-step job ended `Succeeded` at step 37,
with an ETA still set). At its end the trainer knows its final figures, so every pod's local rank 0
writes them, and llmtrain_trainer.launch makes them the container's termination message on a clean
exit. The operator reads them from the attempt's succeeded pods (controller/adapters/observe.py,
controller/policy/ending.py) and writes them into status.progress in the status write that marks the
job Succeeded.

Every pod writes its own copy, not only global rank 0's: the training-operator marks an elastic
PyTorchJob Succeeded as soon as *one* worker succeeds, and its cleanPodPolicy (Running) deletes the
pods still running. The figures are the job's on every pod (the loss is all-reduced, the step is
agreed, tokens/s is the job's at the pod's own step time), as they are at the monitor's scrape of
replica 0, which need not be global rank 0 either.

The format, one value per line, each the final value of the trainer's own series (the names the
monitor scrapes, controller/policy/progress.py's `_PROGRESS_METRICS`):

    llmtrain final summary v1
    llmtrain_trainer_step 40.0
    llmtrain_trainer_loss 6.123
    ...

`llmtrain_trainer_tokens_per_second` and `llmtrain_trainer_mfu` are the means over the worker
process's steps after its first (the warm-up), as `llmtrain local`'s summary prints them, not the
last step's alone.

The message is the tenant's text: `parse` takes it strictly or not at all (any line out of shape,
an unknown or repeated name, a value that is not a plain finite number in [0, MAX_VALUE], or more
than MAX_BYTES: None), so the worst a tenant can do is put other numbers in its own job's status.
This module is stdlib-only: the trainer's launcher imports it on its way out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

HEADER = "llmtrain final summary v1"
# What the operator keeps of the end: where training got to, at what rate, and the attempt's goodput
# counters (status.goodput closes the attempt's record with them).
SERIES = (
    "llmtrain_trainer_step",
    "llmtrain_trainer_loss",
    "llmtrain_trainer_tokens_per_second",
    "llmtrain_trainer_mfu",
    "llmtrain_trainer_last_checkpoint_step",
    "llmtrain_trainer_last_checkpoint_timestamp_seconds",
    "llmtrain_trainer_heartbeat_timestamp_seconds",
    "llmtrain_trainer_train_start_timestamp_seconds",
    "llmtrain_trainer_resume_step",
    "llmtrain_trainer_attempt_steps",
    "llmtrain_trainer_attempt_step_seconds",
    "llmtrain_trainer_attempt_checkpoint_blocking_seconds",
    "llmtrain_trainer_attempt_data_wait_seconds",
    "llmtrain_trainer_inplace_restarts",
    "llmtrain_trainer_inplace_restart_seconds",
    "llmtrain_trainer_inplace_redone_steps",
    "llmtrain_trainer_inplace_redone_seconds",
)
REQUIRED = "llmtrain_trainer_step"  # a summary says at least where training ended
# The whole message: the trainer's is ~1 KiB (17 lines of at most ~75 bytes); the kubelet keeps 4 KiB.
MAX_BYTES = 2048
# Every value is a count, a rate, a ratio, seconds or a Unix time: none is negative, and none is
# anywhere near 1e11 (a Unix time of the year 5138). The bound keeps a hostile value inside what
# status can hold (int64 fields, RFC 3339 times) so it can never make the status write fail.
MAX_VALUE = 1e11
# A plain decimal as Python's repr(float) writes one: digits, an optional fraction, an optional
# exponent. No sign, no inf or nan, no hex, no underscores, no spaces; bounded, so linear to match.
_LINE = re.compile(r"(llmtrain_trainer_[a-z_]{1,64}) ([0-9]{1,20}(?:\.[0-9]{1,24})?(?:e[+-]?[0-9]{1,3})?)", re.ASCII)


def format_summary(values: Mapping[str, float | None]) -> str:
    """The termination message for `values` (series name → final value); names outside SERIES
    and values that are unset or out of range are left out."""
    lines = [HEADER]
    for name in SERIES:
        value = values.get(name)
        if value is None:
            continue
        value = float(value)
        if math.isfinite(value) and 0 <= value <= MAX_VALUE:
            lines.append(f"{name} {value!r}")
    return "\n".join(lines) + "\n"


def parse_summary(text: str | None) -> dict[str, float] | None:
    """The series and values of a final summary, or None unless `text` is one exactly (see the
    module's doc): a message that is anything else (a root cause, the log's tail, a tampered
    summary) yields nothing, never part of it."""
    if not isinstance(text, str) or len(text) > MAX_BYTES or len(text.encode()) > MAX_BYTES:
        return None
    lines = text.removesuffix("\n").split("\n")
    if lines[0] != HEADER or len(lines) > len(SERIES) + 1:
        return None
    out: dict[str, float] = {}
    for line in lines[1:]:
        m = _LINE.fullmatch(line)
        if m is None or m.group(1) not in SERIES or m.group(1) in out:
            return None
        value = float(m.group(2))
        if not (math.isfinite(value) and value <= MAX_VALUE):
            return None
        out[m.group(1)] = value
    return out if REQUIRED in out else None


def from_pod(pod: dict) -> dict[str, float] | None:
    """The final summary a worker pod's container left in its termination message when it exited 0
    (`parse_summary`), or None. Pod as the API returns it. The operator's pod watch calls this for
    every pod event, so a message is parsed only if its container ended 0 and it starts like one."""
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (c.get("state") or {}).get("terminated") or {}
        message = term.get("message")
        if term.get("exitCode") == 0 and isinstance(message, str) and message.startswith(HEADER):
            return parse_summary(message)
    return None

"""`python -m llmtrain_trainer.torchrun [torchrun arguments]`: torchrun itself (torch.distributed.run's
`main`, in this process), which on its way out also writes what failed to $LLMTRAIN_TORCHRUN_FAILURES
(JSON), for llmtrain_trainer.launch to make the container's termination message from:

  * `{"failures": [...]}`, every failed worker of torchrun's last round: global and local rank, exit
    code, the signal that killed it, and the exception it recorded (message and traceback: the
    workers' entry point is under torch's `@record`);
  * `{"agent": {...}}`, torchrun's own exception instead (such as `RendezvousClosedError`: a peer
    pod's torchrun closed the rendezvous).

torchrun's own error file (TORCHELASTIC_ERROR_FILE) keeps only the failure with the smallest
timestamp, in whole seconds, a signal's stamped when the agent notices it; so the rank that only lost
its peer to a SIGKILLed one, recording its exception in the same second, is usually torchrun's "root
cause". With every failure, the launcher can put the signal first. Without the variable this is
plain torchrun.
"""

from __future__ import annotations

import json
import os
import traceback

FAILURES_ENV = "LLMTRAIN_TORCHRUN_FAILURES"
# Where the workers' local rank 0 writes the final summary (llmtrain/final_summary.py;
# MetricsLogger.write_final_summary), a file of llmtrain_trainer.launch's: on a clean exit it becomes
# the termination message. Here, with the other file the launcher hands down, so the workers'
# environment (config.WorkerEnv) reads its name without importing the launcher.
FINAL_SUMMARY_ENV = "LLMTRAIN_FINAL_SUMMARY"
MAX_FAILURES = 64
MAX_TEXT_CHARS = 16384  # of each message and traceback
NO_ERROR_FILE = "<N/A>"  # ProcessFailure.error_file without one (torch's _NOT_AVAILABLE)


def _text(value: object) -> str:
    return value[-MAX_TEXT_CHARS:] if isinstance(value, str) else ""


def failure_record(rank: int, failure) -> dict:
    """One ProcessFailure (torch.distributed.elastic.multiprocessing.errors) as plain JSON."""
    # no error file (a signal, or an exit without @record): torch fills in a placeholder, not a record
    recorded = failure.error_file_data.get("message") if failure.error_file != NO_ERROR_FILE else None
    message, stack = "", ""
    if isinstance(recorded, dict):  # what @record writes
        extra = recorded.get("extraInfo")
        message = _text(recorded.get("message"))
        stack = _text(extra.get("py_callstack")) if isinstance(extra, dict) else ""
    elif isinstance(recorded, str):
        message = _text(recorded)
    return {
        "rank": rank,
        "localRank": failure.local_rank,
        "exitCode": failure.exitcode,
        "signal": failure.signal_name() if failure.exitcode < 0 else None,
        "message": message,
        "traceback": stack,
        "time": failure.timestamp,
    }


def agent_record(err: BaseException) -> dict:
    """torchrun's own exception (call it while handling `err`), as plain JSON."""
    return {"message": _text(f"{type(err).__name__}: {err}"), "traceback": _text(traceback.format_exc())}


def _write(path: str, data: dict) -> None:
    if not path:
        return
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass  # the termination message falls back to the log's tail


def main() -> None:
    path = os.environ.pop(FAILURES_ENV, "")  # torchrun's, not its workers'
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun()
    except ChildFailedError as err:
        failures = sorted(err.failures.items())[:MAX_FAILURES]
        _write(path, {"failures": [failure_record(rank, f) for rank, f in failures]})
        raise
    except Exception as err:
        _write(path, {"agent": agent_record(err)})
        raise


if __name__ == "__main__":
    main()

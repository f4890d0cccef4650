"""Worker entry point: `torchrun ... -m llmtrain_trainer [--spec FILE]`; `... -m llmtrain_trainer
healthcheck [--help]` runs the preflight health check instead (distributed/healthcheck.py).

Inputs: the job spec (wire JSON/YAML, camelCase; a whole LLMTrainingJob document also works) from
`--spec FILE`, else the env var LLMTRAIN_SPEC; job identity from LLMTRAIN_JOB_NAME,
LLMTRAIN_JOB_NAMESPACE, LLMTRAIN_ATTEMPT; metrics port base LLMTRAIN_METRICS_PORT (default 9410,
+ LOCAL_RANK). Rank/world/rendezvous come from torchrun's environment.

A failure leaves the process as an exception, through torch's `@record` (on `_main`): it writes the exception
(type, message, traceback) to the error file torchrun gives each worker (TORCHELASTIC_ERROR_FILE),
so torchrun's failure summary, and the termination message llmtrain_trainer.launch writes from it,
name the failing rank's exception instead of a bare exit code.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int | None:
    argv = sys.argv[1:] if argv is None else argv
    from .distributed.capabilities import raise_permitted

    # IPC_LOCK on EFA pods (see distributed/capabilities.py); a no-op elsewhere. First, before
    # torch's import can start a thread: capset(2) sets the calling thread's capabilities only.
    raise_permitted()
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(_main)(argv)  # None for a SystemExit(0), such as --help's


def _main(argv: list[str]) -> int:
    if argv[:1] == ["healthcheck"]:  # the preflight check (distributed/healthcheck.py) on the same image
        from .distributed.healthcheck import main as healthcheck

        return healthcheck(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m llmtrain_trainer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", help="job spec file (JSON or YAML); default: $LLMTRAIN_SPEC")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("LLMTRAIN_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s rank={os.environ.get('RANK', '0')} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from .checkpoint.checkpointer import SAVE_ERRORS, _short
    from .config import JobIdentity, load_spec
    from .train import emit, run

    try:
        return run(load_spec(args.spec), JobIdentity.from_env())
    except SAVE_ERRORS as err:
        # One structured line to stdout says what failed on which rank, for `llmtrain local` and
        # `kubectl logs` readers; the exception goes on to @record (the error file) and the
        # interpreter (its traceback on stderr, exit code 1).
        emit({"event": "error", "rank": int(os.environ.get("RANK", "0")), "error": _short(err)})
        if isinstance(err, Exception):
            raise
        # DCP's CheckpointException is a BaseException, which @record lets pass unrecorded, and
        # its text is every rank's traceback: _short names the root causes instead.
        raise RuntimeError(_short(err)) from err


if __name__ == "__main__":
    sys.exit(main())

"""`python -m llmtrain_trainer.launch [torchrun arguments]`: torchrun, with a clean stop that exits 0.

torchrun treats SIGTERM as its own death: it forwards the signal, gives the workers a fixed
`--shutdown-timeout` (30 s by default) and then exits 1 whatever they did — so a node drain or spot
interruption that the workers handled perfectly (checkpoint, exit 0) still looks like a failed pod,
and a save that takes longer than 30 s is killed half-way.

This wrapper runs torchrun as a child in its own session and, on SIGTERM or SIGINT, signals the
*workers* (torchrun's children) instead. They finish the micro-batch, checkpoint and exit 0, torchrun
sees every worker succeed and exits 0, and the wrapper exits with torchrun's code. The workers get
the whole pod grace period (`terminationGracePeriodSeconds`), not torchrun's 30 s. A second signal
kills the process tree at once. `llmtrain local` uses the same `stop_workers`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def children(pid: int) -> list[int]:
    """Direct child processes of `pid` (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def stop_workers(torchrun: subprocess.Popen) -> None:
    """SIGTERM to torchrun's worker processes (to torchrun itself only if it has none yet)."""
    for pid in children(torchrun.pid) or [torchrun.pid]:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, children before their own children."""
    out = []
    for child in children(pid):
        out += [child, *descendants(child)]
    return out


def kill_tree(torchrun: subprocess.Popen) -> None:
    """SIGKILL torchrun and every process below it. Killing its process group is not enough:
    torchrun starts each worker in a session of its own, so the workers would run on, orphaned."""
    for pid in [torchrun.pid, *descendants(torchrun.pid)]:  # listed before any of them dies
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def torchrun_command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    proc = subprocess.Popen(torchrun_command(args), start_new_session=True)
    signals = 0

    def on_signal(signum, frame) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            print(f"llmtrain launch: {signal.Signals(signum).name}: stopping the workers (checkpoint, then "
                  "exit); a second signal kills them", file=sys.stderr, flush=True)
            stop_workers(proc)
        else:
            kill_tree(proc)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        while True:
            try:
                return proc.wait()
            except InterruptedError:  # pragma: no cover - PEP 475 retries wait() itself
                continue
    finally:
        if proc.poll() is None:
            kill_tree(proc)
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())

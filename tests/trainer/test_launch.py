"""llmtrain_trainer.launch's process handling, on real processes shaped like torchrun's."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from llmtrain_trainer.launch import descendants, kill_tree

# A stand-in for torchrun: it starts a "worker" in a session of its own (as torch's
# SubprocessHandler does with start_new_session=True), prints its pid and waits.
TORCHRUN_LIKE = """
import subprocess, sys, time
w = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(w.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_kill_tree_kills_workers_in_their_own_sessions():
    proc = subprocess.Popen(
        [sys.executable, "-c", TORCHRUN_LIKE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    worker = int(proc.stdout.readline())
    try:
        assert os.getsid(worker) != os.getsid(proc.pid)  # what made killpg miss it
        assert descendants(proc.pid) == [worker]
        kill_tree(proc)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(worker), "the worker outlived kill_tree"
    finally:
        for pid in (worker, proc.pid):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass

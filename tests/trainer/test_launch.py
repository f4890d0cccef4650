"""llmtrain_trainer.launch's process handling, on real processes shaped like torchrun's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from llmtrain_trainer.launch import descendants, free_port, kill_tree

REPO = Path(__file__).resolve().parents[2]

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


def test_llmtrain_local_and_the_benchmark_drivers_start_torchrun_without_importing_torch():
    """Their own process only finds ports and starts torchrun; importing torch there (for torch's
    get_free_port) cost each `llmtrain local`, bench/*.py run and test ~4 s of CPU before any
    worker started."""
    code = (
        "import sys; sys.path.insert(0, 'bench'); "
        "import llmtrain_trainer.cli.local, llmtrain_trainer.launch, ports, recovery, inplace_restart, gpu; "
        "ports.metrics_port(); llmtrain_trainer.cli.local.free_port(); gpu.rows_for(gpu=True, cpu_compile=True); gpu.peak_for('NVIDIA H200'); "
        "print(len([m for m in sys.modules if m == 'torch' or m.startswith('torch.')]))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0", f"{out.stdout.strip()} torch modules imported"


def test_free_port_is_free_on_loopback_and_on_every_address():
    import socket

    port = free_port()
    with socket.create_server(("0.0.0.0", port)):
        pass
    with socket.create_server(("127.0.0.1", port)):
        pass

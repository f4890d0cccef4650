"""free_port() across processes: xdist workers (and the operators, clusters and trainers they start)
ask for ports at the same time, and each port goes to one of them only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROCESSES = 4
PORTS_EACH = 300

_CHILD = f"""
import json, sys
from llmtrain_devcluster.process import free_port, free_port_block
sys.stdin.readline()  # every process starts asking at once
ports = [free_port() for _ in range({PORTS_EACH})]
ports += [b + i for b in (free_port_block(3) for _ in range(20)) for i in range(3)]
print(json.dumps(ports), flush=True)
sys.stdin.read()  # and hold them until every process has its own (a reservation ends with its process)
"""


def test_concurrent_processes_never_get_the_same_port():
    """Four processes take 360 ports each without binding them (as a test hands a port to a server
    it starts seconds later): bind(0)-and-close gave one port to several of them."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for _ in range(PROCESSES)
    ]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    got = []
    for p in procs:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        got.append(json.loads(line))
    for p in procs:
        p.communicate(timeout=60)  # closes stdin: they exit
    every = [port for ports in got for port in ports]
    assert len(every) == PROCESSES * (PORTS_EACH + 60)
    shared = sorted({port for port in every if every.count(port) > 1})
    assert not shared, f"{len(shared)} ports handed to more than one caller: {shared[:20]}"
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    # below the ephemeral range: no outgoing connection takes one before its server binds it
    assert max(every) < ephemeral, max(every)


def test_a_reservation_ends_with_its_process():
    """The reservation is the process's (an abstract socket the kernel drops at its exit), so a
    dev cluster started later can use the ports of one that is gone; nothing is written to disk."""
    take = "from llmtrain_devcluster.process import free_port; print(free_port())"
    port = int(subprocess.run([sys.executable, "-c", take], capture_output=True, text=True, check=True).stdout)
    probe = (
        "import socket\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.bind('\\0llmtrain-port-{port}')\n"  # fails while anyone holds the reservation
    )
    subprocess.run([sys.executable, "-c", probe], check=True)

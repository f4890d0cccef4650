"""Ports for the trainer processes the benchmarks start.

They come from the dev cluster's allocator (`llmtrain_devcluster.process`), not from `bind(0)`: a
port from `bind(0)` is in the kernel's ephemeral range, where any outgoing connection on the machine
(a kubectl, a gloo pair, another test's trainer) may take it between this driver's check and the
trainer's bind, and torchrun's rendezvous store then exits 1 with "address already in use". Those
ports lie below the ephemeral range and are reserved against every other caller on the machine.
"""

from __future__ import annotations


def free_port() -> int:
    """A port for a server the benchmark starts (a rendezvous store, an S3 stand-in)."""
    from llmtrain_devcluster.process import free_port as reserved

    return reserved()


def metrics_port(ranks: int = 8) -> str:
    """A base port for the workers' /metrics: rank r serves base + r, so `ranks` consecutive ports
    are free (a busy one is only logged). Not 0: that is no "any free port" here, rank 1 would ask
    for port 1."""
    from llmtrain_devcluster.process import free_port_block

    return str(free_port_block(ranks))

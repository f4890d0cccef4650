"""Ports for the trainer processes the benchmarks start."""

from __future__ import annotations


def metrics_port() -> str:
    """A free base port for the workers' /metrics (rank r serves base + r; a busy one is only logged).
    Not 0: that is no "any free port" here, rank 1 would ask for port 1."""
    from llmtrain_trainer.launch import free_port  # stdlib only: this driver never imports torch for it

    return str(free_port())

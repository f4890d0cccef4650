"""Stop requests: SIGTERM (node drain, spot interruption, torchrun shutting down) or SIGINT asks the
trainer to finish the current step, checkpoint and exit 0.

A signal handler only sets a flag; the training loop (train.py) acts on it between steps and between
micro-batches, once every rank has agreed on it: a stop decided by one rank alone would deadlock the
others in the next collective. After each step the flag travels with the step's other flags in one
all-reduce (`Trainer.step`); between micro-batches `StopFlag.agreed` is the whole agreement.
"""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist


class StopFlag:
    """SIGTERM (node drain, spot interruption, torchrun shutting down) or SIGINT: finish the current
    step, checkpoint, exit 0. Handlers only set a flag; the loop acts on it between steps (and between
    micro-batches). `install=False`: no handlers (a test sets `signal` itself)."""

    def __init__(self, install: bool = True):
        self.signal: int | None = None
        if install:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signal = signum

    @staticmethod
    def done() -> None:
        """Training is over (its final checkpoint saved): a stop request has nothing left to stop.
        Ignored from here on, so that a SIGTERM arriving while the process exits cleanly (the pod
        deleted as its peers end) does not kill it: CPython restores the default action of a signal
        with a Python handler when it finalizes, and a worker killed by SIGTERM there counted as a
        failure; torchrun then restarted it in place into a rendezvous whose host was gone, and the
        pod hung until the store timed out (2 min on the JobSet backend) instead of exiting 0."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)

    @property
    def set(self) -> bool:
        return self.signal is not None

    def agreed(self, group) -> bool:
        """Whether any rank was asked to stop (a collective: every rank calls it at the same point)."""
        flag = torch.tensor([float(self.set)])
        dist.all_reduce(flag, group=group)
        return flag.item() > 0

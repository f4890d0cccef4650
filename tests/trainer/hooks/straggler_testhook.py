"""The test-only slow hook of the straggler tests (llmtrain_trainer/metrics/stragglers.py,
test_slowness): a test puts this directory on the workers' PYTHONPATH and sets
LLMTRAIN_TEST_SLOW_RANK=<rank>:<seconds>; that rank then sleeps so long in each step's compute,
as a throttled GPU would be slower. Never packaged: it lives under tests/, outside the packages
setuptools finds (pyproject.toml), and the image copies only operator/llmtrain and
trainer/llmtrain_trainer."""

from __future__ import annotations


def seconds_for(value: str, rank: int) -> float:
    """`value` is "<rank>:<seconds>": the seconds for that rank, 0.0 for the others."""
    slow, _, seconds = value.partition(":")
    return max(0.0, float(seconds)) if slow.strip() == str(rank) else 0.0

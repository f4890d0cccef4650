"""The wall clock, read in one place: observe.py stamps each snapshot with it (decide's `now`) and the
monitor its progress writes. The pure modules take their time from the snapshot
(tests/operator_core/test_decide_purity.py)."""

from __future__ import annotations

import datetime as dt


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)

"""bench/planner_accuracy.py's measurement, on a hand-made profiler trace: the peak of the bytes
torch's CPU allocator holds, rebuilt from the allocation and free events (the defects it replaced:
a baseline taken from the first event in file order, which is a side thread's event seconds into
the run, and the profiler's running counter, which never subtracts frees made on gloo's threads)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _bench(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location("planner_accuracy", REPO / "bench" / "planner_accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _mem(ts, tid, addr, nbytes, counter):
    return {
        "name": "[memory]",
        "ph": "i",
        "ts": ts,
        "tid": tid,
        "args": {"Addr": addr, "Bytes": nbytes, "Total Allocated": counter, "Device Type": 0},
    }


def test_peak_is_rebuilt_from_alloc_and_free_events_in_time_order(monkeypatch):
    bench = _bench(monkeypatch)
    # The trace lists a side thread's events first, though they happen after the model state exists
    # (the counter they carry already holds it).
    side = [_mem(3, 2, 0xE0, 8, 1108), _mem(4, 2, 0xE0, -8, 1100)]
    main = [
        _mem(0.5, 1, 0xF0, -999, 0),  # a block from before the profiler: ignored
        _mem(1, 1, 0xA0, 100, 100),  # model state
        _mem(2, 1, 0xB0, 1000, 1100),
        _mem(5, 1, 0xC0, 50, 1150),  # a gloo buffer, freed on gloo's thread: no free event
        _mem(6, 1, 0xD0, 300, 1450),  # activations
        _mem(7, 1, 0xD0, -300, 1150),
        _mem(8, 1, 0xC0, 60, 1210),  # the gloo buffer's address handed out again
        _mem(9, 1, 0xE8, 200, 1410),
        _mem(10, 1, 0xE8, -200, 1210),
        # the gc.collect() after the run frees the model state and the buffer it still holds
        _mem(11, 1, 0xC0, -60, 1150),
        _mem(12, 1, 0xB0, -1000, 150),
        _mem(13, 1, 0xA0, -100, 50),
    ]
    peak, top, with_unfreed = bench.allocator_peak(side + main)
    # At ts 6: model state 1100 + activations 300. The gloo buffer counts only in the upper bound
    # (1450); at ts 9 the live bytes are 100 + 1000 + 60 + 200 = 1360. The old reading: the counter's
    # maximum 1450 minus the side thread's baseline 1108 - 8 = 1100, i.e. 350.
    assert peak == 1400
    assert top["ts"] == 6
    assert with_unfreed == 1450

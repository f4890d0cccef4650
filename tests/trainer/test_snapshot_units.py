"""In-memory snapshots, in one process (checkpoint/snapshot_file.py, checkpoint/snapshots.py): the
choice of what to restore, and every check a snapshot passes before it is loaded — a snapshot is
tenant-writable memory, so a damaged, foreign or malformed one is refused, never loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from llmtrain_trainer.checkpoint.snapshot_file import BadSnapshot, header_path, parse_header, read_header, slot_path
from llmtrain_trainer.checkpoint.snapshots import Choice, SnapshotConfig, Snapshotter, choices, choose, partner_of

pytestmark = pytest.mark.trainer


def test_choose_takes_the_newest_step_every_rank_has_and_prefers_the_ranks_own_copy():
    # process 0 holds ranks 0 and 2 (its own, its partner's) at steps 10 and 15; rank 1's process lost
    # its folder (a replaced node); process 2 holds 2 and 1 at 10 only (its copy of 15 never arrived)
    inv = [[(0, 10), (0, 15), (2, 10), (2, 15)], [], [(2, 10), (1, 10)]]
    assert choose(inv, 3) == Choice(10, {0: 0, 1: 2, 2: 2})
    assert choose(inv, 3).moved == 1
    assert choose([[(0, 5)], [(0, 5)]], 2) is None  # nobody holds rank 1
    assert choose([[], []], 2) is None


def test_when_a_ranks_newest_snapshot_has_not_reached_its_partner_the_step_before_is_restored():
    # rank 1's node is lost after rank 0 and 1 committed step 14 at home, before 14's copies crossed:
    # rank 0's node holds its own 12 and 14 and rank 1's copy of 12
    assert choose([[(0, 12), (0, 14), (1, 12)], []], 2) == Choice(12, {0: 0, 1: 0})
    assert [c.step for c in choices([[(0, 12), (0, 14), (1, 12), (1, 14)], [(1, 12), (1, 14)]], 2)] == [14, 12]


def test_partner_ring_is_the_same_local_rank_on_the_next_node():
    assert [partner_of(r, 8, 4) for r in range(8)] == [4, 5, 6, 7, 0, 1, 2, 3]
    assert [partner_of(r, 6, 2) for r in range(6)] == [2, 3, 4, 5, 0, 1]
    assert partner_of(0, 4, 4) is None  # one node: no other node to keep a copy


def _cfg(folder: Path, **over) -> SnapshotConfig:
    kw = dict(
        folder=folder,
        job="ns/job",
        attempt=2,
        run="run-1",
        interval_steps=1,
        auto=None,
        partner=True,
        timeout_minutes=1,
    )
    kw.update(over)
    return SnapshotConfig(**kw)


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(33, generator=g), "b": torch.randn(3, 5, generator=g).to(torch.bfloat16)},
        "optim": {"state": {"w": {"step": torch.tensor(float(seed)), "exp_avg": torch.randn(33, generator=g)}}},
        "train": {
            "step": 0,
            "world_size": 1,
            "data": {"step": seed, "samples_consumed": 8 * seed},
            "rng": torch.get_rng_state(),
        },
    }


def _zeros() -> dict:
    s = _state(0)
    for t in (s["model"]["w"], s["model"]["b"], s["optim"]["state"]["w"]["step"], s["optim"]["state"]["w"]["exp_avg"]):
        t.zero_()
    return s


def _taken(folder: Path, steps=(3, 6), **over) -> Snapshotter:
    s = Snapshotter(_cfg(folder, **over), local_world=1, emit=events.append)
    for step in steps:
        s.take(step, _state(step))
    s.wait()
    return s


events: list[dict] = []


@pytest.fixture(autouse=True)
def _events():
    events.clear()


def test_a_snapshot_restores_exactly_and_the_older_slot_survives_until_the_newer_is_committed(
    tmp_path, one_process_group
):
    s = _taken(tmp_path, steps=(3, 6))
    assert (read_header(tmp_path, 0, "a")["step"], read_header(tmp_path, 0, "b")["step"]) == (3, 6)
    assert s.inventory() == [(0, 3), (0, 6)]
    s.take(9, _state(9))  # into slot a, the older; 6 stays whole in b
    # no old header over the slot being written: gone, or already the new one (the commit thread may
    # have finished by now)
    a = header_path(tmp_path, 0, "a")
    assert not a.exists() or read_header(tmp_path, 0, "a")["step"] == 9
    s.wait()
    assert s.inventory() == [(0, 6), (0, 9)]
    choice, state = s.restore(_zeros, newer_than=None)
    assert choice == Choice(9, {0: 0})
    want = _state(9)
    assert torch.equal(state["model"]["w"], want["model"]["w"])
    assert torch.equal(state["model"]["b"], want["model"]["b"]) and state["model"]["b"].dtype == torch.bfloat16
    assert torch.equal(state["optim"]["state"]["w"]["exp_avg"], want["optim"]["state"]["w"]["exp_avg"])
    assert state["train"]["step"] == 9 and state["train"]["data"] == {"step": 9, "samples_consumed": 72}
    s.close()


def test_no_snapshot_newer_than_the_durable_checkpoint_is_no_restore(tmp_path, one_process_group):
    s = _taken(tmp_path, steps=(3, 6))
    assert s.restore(_zeros, newer_than=6) is None
    assert events[-1] == {"event": "snapshot_not_newer", "step": 6, "durable_step": 6}
    s.close()


def _flip_a_bit(p: Path) -> None:
    raw = bytearray(p.read_bytes())
    raw[7] ^= 0x40
    p.write_bytes(bytes(raw))


def test_a_corrupt_payload_is_refused_with_the_rank_and_why_and_the_older_one_restored(tmp_path, one_process_group):
    _taken(tmp_path, steps=(3, 6)).close()
    _flip_a_bit(slot_path(tmp_path, 0, "b"))  # step 6's
    s = Snapshotter(_cfg(tmp_path), local_world=1, emit=events.append)
    choice, state = s.restore(_zeros, newer_than=None)
    assert events[0]["event"] == "snapshot_refused" and events[0]["rank"] == 0 and events[0]["step"] == 6
    assert "CRC-32" in events[0]["error"], events[0]
    assert choice.step == 3 and torch.equal(state["model"]["w"], _state(3)["model"]["w"])
    _flip_a_bit(slot_path(tmp_path, 0, "a"))
    assert s.restore(_zeros, newer_than=None) is None  # the durable checkpoint, then
    s.close()


@pytest.mark.parametrize(
    "field,value", [("attempt", 3), ("job", "ns/other"), ("run", "run-2")], ids=["attempt", "job", "run"]
)
def test_a_snapshot_of_another_attempt_job_or_run_is_never_loaded(tmp_path, one_process_group, field, value):
    _taken(tmp_path).close()
    s = Snapshotter(_cfg(tmp_path, **{field: value}), local_world=1, emit=events.append)
    assert s.inventory() == []
    assert s.restore(_zeros, newer_than=None) is None
    s.close()


def test_a_snapshot_of_another_model_is_refused_not_copied_in(tmp_path, one_process_group):
    s = _taken(tmp_path)
    other = _zeros()
    other["model"]["w"] = torch.zeros(34)
    assert s.restore(lambda: other, newer_than=None) is None
    assert "float32[33]" in events[-1]["error"] and "float32[34]" in events[-1]["error"], events[-1]
    assert torch.equal(other["model"]["b"], torch.zeros(3, 5, dtype=torch.bfloat16))  # nothing copied
    s.close()


def _header() -> dict:
    return {
        "format": "llmtrain-snapshot/1",
        "job": "ns/job",
        "attempt": 1,
        "run": "r",
        "world_size": 2,
        "rank": 0,
        "step": 5,
        "data": {"step": 5},
        "slot": "a",
        "nbytes": 128,
        "crc32": 0,
        "tensors": [{"path": ["model", "w"], "dtype": "float32", "shape": [4], "offset": 64}],
    }


@pytest.mark.parametrize(
    "change,words",
    [
        (lambda h: h.update(format="pickle"), "format"),
        (lambda h: h["tensors"][0].update(dtype="object"), "allowed dtype"),
        (lambda h: h["tensors"][0].update(offset=120), "outside"),
        (lambda h: h["tensors"][0].update(offset=-64), "offset"),
        (lambda h: h["tensors"][0].update(shape=[1 << 50]), "shape"),
        (lambda h: h.update(step=True), "step"),
        (lambda h: h.update(slot="../../etc"), "slot"),
        (lambda h: h.update(data={"x": "y"}), "data"),
        (lambda h: h["tensors"][0].update(path=[]), "path"),
    ],
)
def test_malformed_headers_are_refused_naming_what_is_wrong(change, words):
    h = _header()
    parse_header(json.dumps(h).encode(), "x")  # the unchanged one passes
    change(h)
    with pytest.raises(BadSnapshot, match=words):
        parse_header(json.dumps(h).encode(), "the header")


def test_a_header_that_is_not_json_or_too_big_is_refused():
    with pytest.raises(BadSnapshot, match="not JSON"):
        parse_header(b"\x80\x04pickle", "x")
    with pytest.raises(BadSnapshot, match="at most"):
        parse_header(b" " * ((16 << 20) + 1), "x")

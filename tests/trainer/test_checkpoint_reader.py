"""The checkpoint reader that reads tensor records straight into their destinations
(llmtrain_trainer/checkpoint/reader.py), checked against torch's own `FileSystemReader` on the same
files: the result must be bit-identical for every layout a record can have and every part of it a
load plan can ask for, and a checkpoint written by DCP's writer (the trainer's, unchanged) loads.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

pytestmark = pytest.mark.trainer


def _saved_state() -> dict:
    g = torch.Generator().manual_seed(7)
    return {
        "f32": torch.randn(6, 5, generator=g),
        "bf16": torch.randn(4, 3, generator=g).bfloat16(),
        "i64": torch.arange(7) * 1_000_003,
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "transposed": torch.randn(5, 6, generator=g).t(),  # stored with strides (1, 6)
        "view": torch.randn(10, 4, generator=g)[3:7],  # a view at storage offset 12
        "flag": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
        "obj": {"a": 1, "b": [2, 3]},  # not a tensor: DCP's own path
    }


def _write(root) -> str:
    """A checkpoint as the trainer writes it (LocalStore's writer: DCP's FileSystemWriter, one file
    per rank), the format every checkpoint before and after this reader has."""
    from llmtrain_trainer.checkpoint.stores import LocalStore

    store = LocalStore(str(root))
    dcp.save(_saved_state(), storage_writer=store.writer(1, 0, on_commit=lambda: None), no_dist=True)
    return str(root / "step-0000000001")


def _blank(like: dict) -> dict:
    """Destinations that show any element a load failed to write (NaN / a sentinel)."""
    out = {}
    for k, v in like.items():
        if not torch.is_tensor(v):
            out[k] = {"a": 0, "b": [0, 0]}
        elif v.dtype.is_floating_point:
            out[k] = torch.full_like(v, float("nan"), memory_format=torch.contiguous_format)
        else:
            out[k] = torch.full_like(v, 77 if v.dtype != torch.bool else False, memory_format=torch.contiguous_format)
    return out


def _same(a, b) -> bool:
    if torch.is_tensor(a):
        # bytes, not values: NaN payloads and -0.0 count too
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        )
    return a == b


def test_the_trainers_reader_loads_a_dcp_checkpoint_bit_exactly_without_torch_load_per_tensor(tmp_path, monkeypatch):
    """Defect: every tensor record went through `torch.load` (~0.5 ms of Python and a copy per
    record), so a resume ran at 0.24-0.46x the disk's read speed. Now tensor records are read into
    their destinations directly; the only torch.load calls left are the non-tensor records'."""
    from llmtrain_trainer.checkpoint.stores import LocalStore

    path = _write(tmp_path)
    expected = _blank(_saved_state())
    dcp.load(expected, storage_reader=FileSystemReader(path), no_dist=True)
    assert all(_same(expected[k], v) for k, v in _saved_state().items())  # the reference itself is right

    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(1) or real_load(*a, **k))
    got = _blank(_saved_state())
    dcp.load(got, storage_reader=LocalStore(str(tmp_path)).reader(1, 0), no_dist=True)
    bad = [k for k in expected if not _same(expected[k], got[k])]
    assert not bad, f"differs from FileSystemReader: {bad}"
    records = FileSystemReader(path).read_metadata().state_dict_metadata.values()
    objects = sum(1 for r in records if isinstance(r, BytesStorageMetadata))  # "obj" flattened: a, b
    assert objects == 2 and len(loads) == objects, f"{len(loads)} torch.load calls for {objects} object records"


def test_destinations_of_another_dtype_or_layout_get_what_torch_reader_gives(tmp_path):
    """Not the direct path: a float64 destination (copy_ converts), a non-contiguous destination."""
    from llmtrain_trainer.checkpoint.reader import DirectFileReader

    path = _write(tmp_path)

    def dests():
        return {
            **_blank(_saved_state()),
            "f32": torch.full((6, 5), float("nan"), dtype=torch.float64),
            "transposed": torch.full((5, 6), float("nan")).t(),  # the same strides as stored
            "view": torch.full((4, 4), float("nan")).t(),
        }  # strides the record lacks

    expected, got = dests(), dests()
    dcp.load(expected, storage_reader=FileSystemReader(path), no_dist=True)
    dcp.load(got, storage_reader=DirectFileReader(path), no_dist=True)
    assert not torch.isnan(got["f32"]).any() and not torch.isnan(got["view"]).any()
    assert [k for k in expected if not _same(expected[k], got[k])] == []


class _Planner:
    """The two planner calls a reader makes for a tensor item, over plain destination tensors."""

    def __init__(self, dests: dict):
        self.dests, self.committed = dests, []

    def resolve_tensor(self, req):
        return self.dests[req.dest_index]

    def commit_tensor(self, req, tensor):
        self.committed.append(req.dest_index)


@pytest.mark.parametrize(
    "fqn, storage_offsets, lengths",
    [
        ("f32", (2, 0), (3, 5)),  # rows: a contiguous part of the record, read directly
        ("f32", (1, 1), (4, 3)),  # a block: strided, read via a temporary
        ("f32", (5, 4), (1, 1)),  # the last element
        ("transposed", (0, 2), (6, 3)),  # parts of a record stored with strides (1, 6)
        ("transposed", (3, 0), (2, 5)),
        ("bf16", (3, 0), (1, 3)),
        ("i64", (2,), (4,)),
        ("view", (1, 2), (2, 2)),
    ],
)
def test_parts_of_a_record_a_resharded_load_asks_for(tmp_path, fqn, storage_offsets, lengths):
    """Loading on another world size asks for part of a stored shard (ReadItem.storage_offsets /
    lengths): both readers, given the same plan, write the same bytes."""
    from llmtrain_trainer.checkpoint.reader import DirectFileReader

    path = _write(tmp_path)
    results = []
    for reader_cls in (FileSystemReader, DirectFileReader):
        reader = reader_cls(path)
        metadata = reader.read_metadata()
        reader.set_up_storage_reader(metadata, True)
        (index,) = [i for i in reader.storage_data if i.fqn == fqn]
        saved = _saved_state()[fqn]
        req = ReadItem(
            type=LoadItemType.TENSOR,
            dest_index="d",
            dest_offsets=torch.Size([0] * len(lengths)),
            storage_index=index,
            storage_offsets=torch.Size(storage_offsets),
            lengths=torch.Size(lengths),
        )
        planner = _Planner({"d": torch.full(lengths, 99, dtype=saved.dtype)})
        reader.read_data(LoadPlan([req]), planner).wait()
        assert planner.committed == ["d"]
        results.append(planner.dests["d"])
    want = _saved_state()[fqn]
    for dim, (o, n) in enumerate(zip(storage_offsets, lengths)):
        want = want.narrow(dim, o, n)
    assert _same(results[0], want) and _same(results[1], want)


def test_a_record_it_does_not_recognise_goes_through_torchs_reader(tmp_path):
    """A tensor saved with a non-plain pickle (here: a Parameter, rebuilt by another function) is
    not guessed at: DCP's reader loads it, with the same result."""
    from llmtrain_trainer.checkpoint.reader import DirectFileReader
    from llmtrain_trainer.checkpoint.records import _NotPlain, parse_record

    path = _write(tmp_path)
    reader = DirectFileReader(path)
    reader.set_up_storage_reader(reader.read_metadata(), True)
    with pytest.raises(_NotPlain):
        parse_record(b"PK\x03\x04" + bytes(100), b"not a zip", 0, 200)
    plan = LoadPlan(
        [
            ReadItem(
                type=LoadItemType.TENSOR,
                dest_index="d",
                dest_offsets=torch.Size([0, 0]),
                storage_index=i,
                storage_offsets=torch.Size([0, 0]),
                lengths=torch.Size([6, 5]),
            )
            for i in reader.storage_data
            if i.fqn == "f32"
        ]
    )
    with open(f"{path}/__0_0.distcp", "r+b") as f:  # break the record's end-of-central-directory
        info = reader.storage_data[plan.items[0].storage_index]
        f.seek(info.offset + info.length - 22)
        f.write(b"XXXX")
    planner = _Planner({"d": torch.zeros(6, 5)})
    # torch's zip reader refuses the broken record too: the error is its own, not a wrong tensor
    with pytest.raises(Exception, match=r"(?i)zip|central|archive"):
        reader.read_data(dataclasses.replace(plan), planner).wait()


def test_a_torch_without_the_storage_type_map_falls_back_to_dcps_reader(tmp_path, monkeypatch):
    """The direct reader reads `torch.storage._dtype_to_storage_type_map` at import. A torch without
    it must not leave a trainer that cannot start: importing warns, and loads go through DCP's own
    reader (every tensor record `torch.load`ed), with the same result."""
    import importlib.util
    import sys

    import llmtrain_trainer.checkpoint.reader as installed

    path = _write(tmp_path)
    expected = _blank(_saved_state())
    dcp.load(expected, storage_reader=FileSystemReader(path), no_dist=True)

    import llmtrain_trainer.checkpoint.records as installed_records

    def fresh(name: str, file: str):
        """A fresh import of `file` as `name` in sys.modules (restored after the test), so that the
        reader's own relative import (.records) finds the fresh record module."""
        spec = importlib.util.spec_from_file_location(name, file)
        mod = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, mod)
        spec.loader.exec_module(mod)
        return mod

    # Only our modules' imports see the attribute missing (torch.save itself, which wrote the
    # checkpoint above, uses it in this torch).
    with pytest.MonkeyPatch.context() as mp:
        mp.delattr(torch.storage, "_dtype_to_storage_type_map")
        with pytest.warns(RuntimeWarning, match="_dtype_to_storage_type_map"):  # as a trainer on that torch
            fresh("llmtrain_trainer.checkpoint.records", installed_records.__file__)
        module = fresh("llmtrain_trainer.checkpoint._reader_without_map", installed.__file__)
    assert module.DIRECT_READS is False

    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(1) or real_load(*a, **k))
    got = _blank(_saved_state())
    dcp.load(got, storage_reader=module.DirectFileReader(path), no_dist=True)
    assert [k for k in expected if not _same(expected[k], got[k])] == []
    tensors = sum(1 for v in _saved_state().values() if torch.is_tensor(v))
    assert len(loads) >= tensors  # DCP's reader did the reading, record by record

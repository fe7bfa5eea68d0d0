"""``torchcomms.hooks.FlightRecorderHook``: ring buffer, dump layout, PyTorch's analyzer reads it.

A 2-rank body records real operations and dumps them (JSON, and c10d's pickle layout);
the test feeds the dumps to ``torch.distributed.flight_recorder``'s database builder.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import time
import weakref

import pytest
import torch
import torch.distributed as dist

import torchcomms
from torchcomms import ReduceOp
from torchcomms.device_mesh import as_process_group
from torchcomms.hooks import FlightRecorderHook
from torchcomms_core.testing import unique_name


def _comm():
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("fr"))


def body_record_and_dump(json_dir: str, pickle_dir: str) -> dict:
    os.environ["TORCHCOMM_FR_DUMP_TEMP_FILE"] = os.path.join(json_dir, "fr_rank_")
    try:
        comm = _comm()
        recorder = FlightRecorderHook(max_entries=64, isolated=True).register_with_comm(comm)
        pg = as_process_group(comm, group_desc="default_pg")
        r, n = comm.get_rank(), comm.get_size()
        t = torch.ones(4)
        dist.all_reduce(t, group=pg)
        out = torch.empty(2 * n)
        dist.all_gather_into_tensor(out, torch.ones(2), group=pg)
        comm.reduce_scatter_single(torch.empty(2), torch.ones(2 * n), ReduceOp.SUM)
        if r == 0:
            comm.send(torch.ones(3), 1)
        else:
            comm.recv(torch.empty(3), 0)
        work = comm.all_reduce(torch.ones(5), ReduceOp.SUM, async_op=True)
        work.wait()
        comm.barrier()
        path = recorder.dump()
        recorder.dump(os.path.join(pickle_dir, f"fr_rank_{dist.get_rank()}"), format="pickle")
        with open(path) as f:
            return json.load(f)
    finally:
        os.environ.pop("TORCHCOMM_FR_DUMP_TEMP_FILE", None)
        if dist.is_initialized():
            dist.destroy_process_group()


def _analyzer_args(trace_dir: str) -> argparse.Namespace:
    from torch.distributed.flight_recorder.components.config_manager import JobConfig

    return JobConfig().parse_args([trace_dir, "-p", "fr_rank_"])


def test_dump_has_c10d_fields_and_the_analyzer_matches_every_collective(pool2, tmp_path) -> None:
    from torch.distributed.flight_recorder.components.builder import build_db

    json_dir, pickle_dir = tmp_path / "json", tmp_path / "pickle"
    json_dir.mkdir()
    pickle_dir.mkdir()
    dumps = pool2.run(body_record_and_dump, str(json_dir), str(pickle_dir))
    assert sorted(os.listdir(json_dir)) == ["fr_rank_0", "fr_rank_1"]

    first = dumps[0]
    assert first["version"] == "2.10"
    assert set(first) >= {"version", "pg_config", "pg_status", "entries"}
    names = [e["profiling_name"] for e in first["entries"]]
    assert names == [
        "gloo:all_reduce",
        "gloo:all_gather_single",
        "gloo:reduce_scatter_single",
        "gloo:send 0->1",
        "gloo:all_reduce",
        "gloo:barrier",
    ]
    entry = first["entries"][1]
    for key in (
        "record_id",
        "pg_id",
        "process_group",
        "collective_seq_id",
        "p2p_seq_id",
        "op_id",
        "time_created_ns",
        "input_sizes",
        "input_dtypes",
        "output_sizes",
        "output_dtypes",
        "state",
        "time_discovered_started_ns",
        "time_discovered_completed_ns",
        "frames",
        "timeout_ms",
        "is_p2p",
    ):
        assert key in entry, key
    assert entry["input_sizes"] == [[2]] and entry["output_sizes"] == [[4]]
    assert entry["input_dtypes"] == ["Float"]
    assert entry["state"] == "completed"
    assert any(f["name"] == "body_record_and_dump" for f in entry["frames"])
    group = entry["process_group"][0]
    assert first["pg_config"][group]["ranks"] == "[0,1]"
    assert first["pg_config"][group]["desc"] == "default_pg"

    details = {}
    for rank, dump in enumerate(dumps):
        details[f"fr_rank_{rank}"] = {
            "host_name": f"host_rank{rank}",
            "rank": rank,
            "entries": dump["entries"],
            "version": dump["version"],
            "pg_config": dump["pg_config"],
        }
    db = build_db(details, _analyzer_args(str(json_dir)), "2.10")
    assert len(db.collectives) == 6
    assert all(c.pass_check for c in db.collectives), db.collectives
    assert [c.collective_name for c in db.collectives][3].startswith("gloo:send")

    from torch.distributed.flight_recorder import fr_trace

    out = tmp_path / "db.pkl"
    fr_trace.main([str(pickle_dir), "-p", "fr_rank_", "-o", str(out)])
    with open(out, "rb") as f:
        _, pickled_db = pickle.load(f)
    assert len(pickled_db.collectives) == 6


def body_sizes_at_record_time() -> list:
    comm = _comm()
    recorder = FlightRecorderHook(max_entries=8, isolated=True).register_with_comm(comm)
    n = comm.get_size()
    t = torch.ones(4)
    comm.all_reduce(t, ReduceOp.SUM)
    out, inp = torch.empty(2 * n), torch.ones(2)
    comm.all_gather_single(out, inp)
    gathered = [torch.empty(3) for _ in range(n)]
    comm.all_gather(gathered, torch.ones(3))
    # Resized after the operations: the dump still shows the sizes they ran with.
    t.resize_(7)
    inp.resize_(1, 5)
    out.resize_(0)
    gathered[0].resize_(9)
    refs = [weakref.ref(x) for x in (t, inp, out, *gathered)]
    del t, inp, out, gathered
    # The recorder holds no tensor (gloo may take a moment to drop its own references).
    deadline = time.monotonic() + 10
    while any(ref() is not None for ref in refs) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    alive = sum(ref() is not None for ref in refs)
    entries = json.loads(recorder.dump_json())["entries"]
    comm.finalize()
    return [[[e["input_sizes"], e["output_sizes"], e["input_dtypes"]] for e in entries], alive]


def test_dumps_show_the_sizes_at_record_time_and_keep_no_tensor(pool2) -> None:
    for sizes, alive in pool2.run(body_sizes_at_record_time):
        assert sizes == [
            [[[4]], [[4]], ["Float"]],
            [[[2]], [[4]], ["Float"]],
            [[[3]], [[2, 3]], ["Float"]],
        ]
        assert alive == 0


def body_zero_entries() -> tuple:
    comm = _comm()
    recorder = FlightRecorderHook(max_entries=0, isolated=True)
    assert recorder.register_with_comm(comm) is recorder
    t = torch.ones(2)
    comm.all_reduce(t, ReduceOp.SUM)
    entries = recorder.dump_dict()["entries"]
    comm.finalize()
    return len(entries), t.tolist()


def test_zero_max_entries_records_nothing_and_is_harmless(pool2) -> None:
    assert pool2.run(body_zero_entries) == [(0, [2.0, 2.0])] * 2


def body_ring_buffer_keeps_the_last_entries() -> list:
    comm = _comm()
    recorder = FlightRecorderHook(max_entries=3, isolated=True).register_with_comm(comm)
    for _ in range(5):
        comm.barrier()
    ids = [e["record_id"] for e in recorder.dump_dict()["entries"]]
    seqs = [e["collective_seq_id"] for e in recorder.dump_dict()["entries"]]
    comm.finalize()
    return [ids, seqs]


def test_ring_buffer_keeps_the_last_entries(pool2) -> None:
    assert pool2.run(body_ring_buffer_keeps_the_last_entries)[0] == [[2, 3, 4], [3, 4, 5]]


def body_async_state_and_batches() -> list:
    comm = _comm()
    recorder = FlightRecorderHook(max_entries=16, isolated=True).register_with_comm(comm)
    r, n = comm.get_rank(), comm.get_size()
    batch = comm.batch_op_create()
    batch.send(torch.ones(2), (r + 1) % n).recv(torch.empty(2), (r - 1) % n)
    work = batch.issue(async_op=True)
    pending = [e["state"] for e in recorder.dump_dict()["entries"]]
    work.wait()
    entries = recorder.dump_dict()["entries"]
    comm.finalize()
    return [
        pending,
        [e["profiling_name"] for e in entries],
        [e["state"] for e in entries],
        [e["p2p_seq_id"] for e in entries],
    ]


def test_batches_are_recorded_per_operation_with_their_state(pool2) -> None:
    pending, names, states, seqs = pool2.run(body_async_state_and_batches)[0]
    assert set(pending) <= {"started", "completed"}
    assert names == ["gloo:send 0->1", "gloo:recv 0<-1"]
    assert states == ["completed", "completed"]
    assert seqs == [1, 1]


def test_invalid_max_entries_is_refused() -> None:
    with pytest.raises(ValueError, match="max_entries must be >= 0"):
        FlightRecorderHook(max_entries=-1)
    with pytest.raises(TypeError, match="must be an int"):
        FlightRecorderHook(max_entries="10")  # type: ignore[arg-type]


def body_splits_inherit_and_failures_dump(dump_dir: str) -> list:
    os.environ["TORCHCOMM_FR_DUMP_TEMP_FILE"] = os.path.join(dump_dir, "trace_")
    try:
        comm = _comm()
        recorder = FlightRecorderHook(max_entries=16, isolated=True).register_with_comm(comm)
        pg = as_process_group(comm)
        sub = pg.split_group([dist.get_rank()])
        dist.all_reduce(torch.ones(1), group=sub)
        inherited = FlightRecorderHook.attached_to(sub.get_comm()) == [recorder]
        groups = sorted({e["pg_id"] for e in recorder.dump_dict()["entries"]})
        sub.get_comm().abort()  # a failure or abort writes the dump by itself
        return [
            inherited,
            groups,
            os.path.exists(os.path.join(dump_dir, f"trace_{dist.get_rank()}")),
        ]
    finally:
        os.environ.pop("TORCHCOMM_FR_DUMP_TEMP_FILE", None)
        if dist.is_initialized():
            dist.destroy_process_group()


def test_split_groups_inherit_the_recorder_and_an_abort_dumps(pool2, tmp_path) -> None:
    for inherited, groups, dumped in pool2.run(
        body_splits_inherit_and_failures_dump, str(tmp_path)
    ):
        assert inherited
        assert groups == [0, 1]
        assert dumped


# -- the c10d bridge's engine lane: recorded by c10d's own recorder, or here ---------------


def body_lane_stacks(c10d_size: str | None) -> dict:
    """A bridged group's lane entries, with c10d's recorder sized ``c10d_size``."""
    import threading

    saved = os.environ.get("TORCH_FR_BUFFER_SIZE")
    if c10d_size is None:
        os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
    else:
        os.environ["TORCH_FR_BUFFER_SIZE"] = c10d_size
    comm = _comm()
    try:
        recorder = FlightRecorderHook(max_entries=16, isolated=True).register_with_comm(comm)
        pg = as_process_group(comm)
        wrapper = pg._get_backend(torch.device("cpu"))
        n = comm.get_size()

        def training_step() -> None:
            dist.all_reduce(torch.ones(4), group=pg)
            dist.all_gather_into_tensor(torch.empty(2 * n), torch.ones(2), group=pg)
            work = dist.broadcast(torch.ones(3), 0, group=pg, async_op=True)
            work.wait()

        training_step()
        entries = recorder.dump_dict()["entries"]
        return {
            "by c10d": type(wrapper._lane_now).__name__ == "_Lane",
            "names": [e["profiling_name"] for e in entries],
            "frames": [[f["name"] for f in e["frames"]] for e in entries],
            "own frames": [
                f["filename"]
                for e in entries
                for f in e["frames"]
                if "torchcomms_core" in f["filename"]
            ],
            "threads": {e["thread_name"] for e in entries},
            "thread": threading.current_thread().name,
        }
    finally:
        if saved is None:
            os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
        else:
            os.environ["TORCH_FR_BUFFER_SIZE"] = saved
        if dist.is_initialized():
            dist.destroy_process_group()  # as_process_group made it the default group
        comm.finalize()


@pytest.mark.parametrize(
    ("c10d_size", "by_c10d"),
    [(None, True), ("4", False), ("0", False), ("lots", False)],
    ids=["c10d-default-2000", "c10d-smaller-than-ours", "c10d-off", "c10d-size-not-a-number"],
)
def test_lane_entries_have_the_callers_stack_recorded_by_c10d_or_here(
    pool2, c10d_size, by_c10d
) -> None:
    # Taken from the engine's records in c10d's recorder when that keeps at least as many
    # entries as ours (16 here), else recorded by our own: the same entries either way.
    for out in pool2.run(body_lane_stacks, c10d_size):
        assert out["by c10d"] is by_c10d
        assert out["names"] == ["gloo:all_reduce", "gloo:all_gather_single", "gloo:broadcast"], out
        for frames in out["frames"]:
            # torch.distributed's own frames first (as in a plain group's dump), then ours.
            at = frames.index("training_step")
            assert frames[at : at + 2] == ["training_step", "body_lane_stacks"], frames
        assert out["own frames"] == []
        assert out["threads"] == {out["thread"]}


def body_lane_numbering(c10d_size: str | None, max_entries: int) -> dict:
    """Calls that take the engine lane mixed with calls the hooks record (point-to-point
    among them), then a reset and one more call; what the recorder dumps each time."""
    saved = os.environ.get("TORCH_FR_BUFFER_SIZE")
    if c10d_size is None:
        os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
    else:
        os.environ["TORCH_FR_BUFFER_SIZE"] = c10d_size
    comm = _comm()
    try:
        recorder = FlightRecorderHook(max_entries=max_entries, isolated=True)
        recorder.register_with_comm(comm)
        pg = as_process_group(comm)
        wrapper = pg._get_backend(torch.device("cpu"))
        r, n = comm.get_rank(), comm.get_size()
        dist.all_reduce(torch.ones(4), group=pg)  # the lane
        dist.reduce(torch.ones(3), 0, group=pg)  # the hooks (no lane for reduce)
        dist.all_gather_into_tensor(torch.empty(2 * n), torch.ones(2), group=pg)
        if r == 0:
            dist.send(torch.ones(5), 1, group=pg)
        else:
            dist.recv(torch.empty(5), 0, group=pg)
        dist.barrier(group=pg)
        dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * n), group=pg)
        comm.all_reduce(torch.ones(6), ReduceOp.SUM)  # the communicator's own call
        work = dist.broadcast(torch.ones(7), 0, group=pg, async_op=True)
        work.wait()
        dist.all_reduce(torch.ones(8), group=pg)
        fields = (
            "record_id",
            "collective_seq_id",
            "p2p_seq_id",
            "op_id",
            "profiling_name",
            "input_sizes",
            "input_dtypes",
            "output_sizes",
            "output_dtypes",
            "state",
            "retired",
            "is_p2p",
            "thread_name",
            "process_group",
        )

        def entries() -> list[list]:
            return [[e[f] for f in fields] for e in recorder.dump_dict()["entries"]]

        first = entries()
        size = recorder.size()
        recorder.reset()
        after_reset = entries()
        dist.all_reduce(torch.ones(9), group=pg)
        return {
            "by c10d": type(wrapper._lane_now).__name__ == "_Lane",
            "entries": first,
            "size": size,
            "after reset": after_reset,
            "last": entries(),
            "n": n,
        }
    finally:
        if saved is None:
            os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
        else:
            os.environ["TORCH_FR_BUFFER_SIZE"] = saved
        if dist.is_initialized():
            dist.destroy_process_group()
        comm.finalize()


def test_the_engine_lane_recorded_by_c10d_dumps_what_recording_here_dumps(pool2) -> None:
    # The same calls, with c10d's recorder recording the engine lane (the default) and
    # with it off (every call recorded here): the same entries, numbered as one sequence.
    by_c10d = pool2.run(body_lane_numbering, None, 64)
    here = pool2.run(body_lane_numbering, "0", 64)
    for rank, (a, b) in enumerate(zip(by_c10d, here, strict=True)):
        assert a["by c10d"] is True and b["by c10d"] is False
        # The group's name is made for each run; the rest is the same.
        assert [e[:-1] for e in a["entries"]] == [e[:-1] for e in b["entries"]]
        assert {e[-1][1] for e in a["entries"]} == {e[-1][1] for e in b["entries"]}
        n, me = a["n"], rank
        p2p = "gloo:send 0->1" if rank == 0 else "gloo:recv 1<-0"
        assert [e[1:5] for e in a["entries"]] == [
            [1, 0, 1, "gloo:all_reduce"],
            [2, 0, 2, "gloo:reduce"],
            [3, 0, 3, "gloo:all_gather_single"],
            [3, 1, 4, p2p],
            [4, 1, 5, "gloo:barrier"],
            [5, 1, 6, "gloo:reduce_scatter_single"],
            [6, 1, 7, "gloo:all_reduce"],
            [7, 1, 8, "gloo:broadcast"],
            [8, 1, 9, "gloo:all_reduce"],
        ], me
        sizes = {e[4]: (e[5], e[7]) for e in a["entries"]}
        assert sizes["gloo:all_gather_single"] == ([[2]], [[2 * n]])
        assert sizes["gloo:reduce_scatter_single"] == ([[2 * n]], [[2]])
        assert [e[0] for e in a["entries"]] == list(range(9))
        assert {(e[9], e[10]) for e in a["entries"]} == {("completed", True)}
        assert a["size"] == 9
        assert a["after reset"] == b["after reset"] == []
        # After a reset the numbering goes on.
        assert [e[:5] for e in a["last"]] == [e[:5] for e in b["last"]]
        assert [e[1:5] for e in a["last"]] == [[9, 1, 10, "gloo:all_reduce"]]


def test_the_engine_lane_recorded_by_c10d_keeps_the_last_entries(pool2) -> None:
    # A ring of 4: the last four of the nine calls, numbered as in the whole sequence.
    for a, b in zip(
        pool2.run(body_lane_numbering, None, 4), pool2.run(body_lane_numbering, "0", 4), strict=True
    ):
        assert a["by c10d"] is True
        assert [e[1:-1] for e in a["entries"]] == [e[1:-1] for e in b["entries"]]
        assert [e[3] for e in a["entries"]] == [6, 7, 8, 9]
        assert [e[0] for e in a["entries"]] == [5, 6, 7, 8]
        assert a["size"] == 4


def body_lane_after_unregister(c10d_size: str | None) -> dict:
    saved = os.environ.get("TORCH_FR_BUFFER_SIZE")
    if c10d_size is None:
        os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
    else:
        os.environ["TORCH_FR_BUFFER_SIZE"] = c10d_size
    comm = _comm()
    try:
        recorder = FlightRecorderHook(max_entries=16, isolated=True).register_with_comm(comm)
        pg = as_process_group(comm)
        wrapper = pg._get_backend(torch.device("cpu"))
        by_c10d = type(wrapper._lane_now).__name__ == "_Lane"
        dist.all_reduce(torch.ones(4), group=pg)
        dist.broadcast(torch.ones(3), 0, group=pg)
        recorder.unregister()
        dist.all_reduce(torch.ones(5), group=pg)  # not recorded any more
        entries = recorder.dump_dict()["entries"]
        return {
            "by c10d": by_c10d,
            "kept": [(e["profiling_name"], e["input_sizes"], e["state"]) for e in entries],
        }
    finally:
        if saved is None:
            os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
        else:
            os.environ["TORCH_FR_BUFFER_SIZE"] = saved
        if dist.is_initialized():
            dist.destroy_process_group()
        comm.finalize()


@pytest.mark.parametrize("c10d_size", [None, "0"], ids=["lane-by-c10d", "lane-recorded-here"])
def test_unregistering_keeps_the_lane_entries(pool2, c10d_size) -> None:
    for out in pool2.run(body_lane_after_unregister, c10d_size):
        assert out["by c10d"] is (c10d_size is None)
        assert out["kept"] == [
            ("gloo:all_reduce", [[4]], "completed"),
            ("gloo:broadcast", [[3]], "completed"),
        ]

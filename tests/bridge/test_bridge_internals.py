"""How the c10d bridge is put together, and what of torch it relies on.

The bridge reads two values that torch 2.13 gives it no other way (c10d's group rank and
size while it creates a group, and ``batch_isend_irecv``'s list); the first tests here fail
as soon as torch changes what they read. The others check the table of operations and which
lane a call takes, on real ranks.
"""

from __future__ import annotations

import inspect
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from torchcomms_core.c10d import ops as bridge_ops
from torchcomms_core.c10d.backend_wrapper import _BackendWrapper
from torchcomms_core.foundation import torch_compat
from torchcomms_core.testing import unique_name


def test_batch_isend_irecv_still_names_its_list_and_coalesces_as_the_release_says() -> None:
    fn = inspect.unwrap(distributed_c10d.batch_isend_irecv)
    assert "p2p_op_list" in fn.__code__.co_varnames, (
        "torch renamed batch_isend_irecv's argument: update torchcomms_core.c10d.p2p_batch"
    )
    source = inspect.getsource(fn)
    if torch_compat.BATCH_P2P_COALESCES_SUBCLASSES:
        # 2.14 brackets any group whose backend supports coalescing (ours says it does).
        assert "isinstance(group, ProcessGroup)" in source and "supports_coalescing" in source
    else:
        # 2.13 brackets only c10d's own class: the bridge reads the list from the frame.
        assert "type(group) is ProcessGroup" in source


def test_c10d_still_creates_groups_with_the_locals_new_comm_reads() -> None:
    fn = inspect.unwrap(distributed_c10d._new_process_group_helper)
    names = set(fn.__code__.co_varnames)
    missing = {"group_rank", "group_size", "timeout", "global_ranks_in_group"} - names
    assert not missing, f"torch renamed {missing}: update torchcomms_core.creation.group_record"


def test_every_operation_of_the_table_is_a_c10d_method_and_a_wrapper_method() -> None:
    seen: set[str] = set()
    for op in bridge_ops.OPS:
        for name in op.names:
            assert name not in seen, f"{name} is in two rows"
            seen.add(name)
            assert hasattr(dist.ProcessGroup, name), name
            assert getattr(_BackendWrapper, name).__name__ == op.names[0]
        if op.engine is not None:
            assert hasattr(dist.ProcessGroupGloo, op.engine), op.engine
    # The calls torch.distributed's collectives make on a group are all in the table.
    for name in ("allreduce", "_allgather_base", "_reduce_scatter_base", "alltoall_base"):
        assert name in seen


# -- on real ranks ----------------------------------------------------------------------


def _world(fr_size: str | None = None) -> Any:
    """The switch's world group; ``fr_size``: ``TORCH_FR_BUFFER_SIZE`` while it is made
    (PyTorch's switch registers a flight recorder of that size: none when unset)."""
    saved_size = os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
    if fr_size is not None:
        os.environ["TORCH_FR_BUFFER_SIZE"] = fr_size
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=60),
    )
    saved = dist.config.use_torchcomms
    dist.config.use_torchcomms = True
    try:
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(unique_name("internals"), store),
            rank=int(os.environ["TORCHCOMM_RANK"]),
            world_size=int(os.environ["TORCHCOMM_SIZE"]),
        )
    finally:
        dist.config.use_torchcomms = saved
        os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
        if saved_size is not None:
            os.environ["TORCH_FR_BUFFER_SIZE"] = saved_size
    return dist.group.WORLD


def body_lanes() -> dict[str, Any]:
    from torchcomms_core.hooks.flight_recorder import global_recorder

    pg = _world("2000")
    out: dict[str, Any] = {}
    try:
        assert isinstance(pg, _BackendWrapper)
        n = pg.size()
        t = torch.ones(4)
        # As created: only the flight recorder observes the communicator.
        out["created"] = (pg._engine_for_call() is not None, pg._recorded_lane() is not None)
        work = dist.all_reduce(t, async_op=True)
        out["work type"] = type(work).__name__
        work.wait()
        dist.all_gather_into_tensor(torch.empty(4 * n), t)
        entries = [e for e in global_recorder().dump_dict()["entries"] if e["pg_id"] >= 0]
        out["recorded"] = [(e["profiling_name"], e["state"], e["input_sizes"]) for e in entries][
            -2:
        ]
        # A hook of the user's: every call takes the general path, through the hooks.
        seen: list[str] = []
        handle = pg.get_comm().register_pre_hook(lambda name, *rest: seen.append(str(name)))
        out["hooked"] = (pg._engine_for_call() is not None, pg._recorded_lane() is not None)
        work = dist.all_reduce(t, async_op=True)
        out["hooked work type"] = type(work).__name__
        work.wait()
        out["hook saw"] = seen
        handle.remove()
        out["after removal"] = pg._recorded_lane() is not None
        out["result"] = t.tolist()
        # The lane follows the communicator's changes: timeout, the recorder leaving.
        comm = pg.get_comm()
        comm.set_timeout(timedelta(seconds=321))
        out["lane timeout"] = pg._lane_timeout.total_seconds()
        from torchcomms.hooks import FlightRecorderHook

        recorders = FlightRecorderHook.attached_to(comm)
        for recorder in recorders:
            recorder.unregister()
        out["unrecorded"] = (pg._engine_for_call() is not None, pg._recorded_lane() is not None)
        for recorder in recorders:
            recorder.register_with_comm(comm)
        out["recorded again"] = pg._recorded_lane() is not None
        # A wrapper the communicator outlives is not kept alive by it.
        import gc
        import weakref

        extra = weakref.ref(_BackendWrapper(comm))
        gc.collect()
        out["extra wrapper freed"] = extra() is None
    finally:
        dist.destroy_process_group()
    return out


def test_calls_take_the_engine_lane_unless_a_hook_observes_them(pool) -> None:
    n = pool.world_size
    for out in pool.run(body_lanes, timeout=120):
        assert out["created"] == (False, True)  # the recorder: recorded lane
        assert out["work type"] != "CommWork"  # the engine's own work
        # Recorded as the general path's hooks record them, settled from the engine's work.
        assert out["recorded"] == [
            ("gloo:all_reduce", "completed", [[4]]),
            ("gloo:all_gather_single", "completed", [[4]]),
        ]
        assert out["hooked"] == (False, False)
        assert out["hooked work type"] == "CommWork"
        assert out["hook saw"] and "all_reduce" in out["hook saw"][0].lower()
        assert out["after removal"] is True
        assert out["lane timeout"] == 321.0
        assert out["unrecorded"] == (True, False)
        assert out["recorded again"] is True
        assert out["extra wrapper freed"] is True
        assert out["result"] == [float(n * n)] * 4


def body_switch_default() -> dict[str, Any]:
    """The switch's world group with ``TORCH_FR_BUFFER_SIZE`` unset: its recorder of 0
    entries observes nothing, so calls keep the lean lanes."""
    from torchcomms.hooks import FlightRecorderHook

    pg = _world(None)
    try:
        comm = pg.get_comm()
        t = torch.ones(4)
        dist.all_reduce(t)
        return {
            "recorders": len(FlightRecorderHook.attached_to(comm)),
            "comm lane": comm.takes_lean_calls(),
            "engine lane": pg._engine_for_call() is not None,
            "result": t.tolist(),
        }
    finally:
        dist.destroy_process_group()


def test_the_switchs_recorder_of_zero_entries_keeps_the_lean_lanes(pool) -> None:
    n = pool.world_size
    for out in pool.run(body_switch_default, timeout=120):
        assert out == {
            "recorders": 0,
            "comm lane": True,
            "engine lane": True,
            "result": [float(n)] * 4,
        }

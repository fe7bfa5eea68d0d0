"""Under ``TORCH_DISTRIBUTED_USE_TORCHCOMMS`` c10d's own registered backends keep working.

Two things c10d code expects of a group that the switch used to break (issue #34):

* A backend registered with ``torch.distributed.Backend.register_backend`` (ucc, hccl, a
  vendor's, PyTorch's ``dummy`` and ``threaded`` test backends) is served through the
  c10d adapter: the group is a torchcomms communicator whose engine is what the
  registered creator returns. The same user code runs on a plain group and on a switched
  one, and both must see the same results, ranks and creator calls.
* c10d code that reaches for a method of the group's engine (gloo's ``create_device``,
  which DDP's and ``broadcast_coalesced``'s tests call) gets the engine's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

# The face completes torch's view of the bridge (the switch is turned on at run time).
import torchcomms  # noqa: F401
from torchcomms_core.foundation import torch_compat
from torchcomms_core.testing import unique_name

# Under the switch, torch 2.13 hands every backend name to torchcomms, which wraps a
# backend it does not provide in a communicator; 2.14 leaves such a backend on c10d's own
# path (it asks torchcomms.is_backend_built first). Either way the results are the same.
WRAPS_FOREIGN = not torch_compat.SWITCH_ASKS_BACKEND_BUILT

_client_store: Any = None


def _store() -> Any:
    global _client_store
    if _client_store is None:
        _client_store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=60),
        )
    return dist.PrefixStore(unique_name("c10d-backends"), _client_store)


def _rank() -> int:
    return int(os.environ["TORCHCOMM_RANK"])


def _size() -> int:
    return int(os.environ["TORCHCOMM_SIZE"])


# -- backends registered with c10d, as a vendor would --------------------------------------

# What each creator was called with, per backend name (rank, size, timeout, extras).
_CALLS: dict[str, list[list[Any]]] = {}


def _gloo_creator(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    """A C++ c10d ``Backend`` (as ucc's or hccl's creator returns)."""
    _CALLS.setdefault("vendorcc", []).append([rank, size, timeout.total_seconds()])
    return dist.ProcessGroupGloo(store, rank, size, timeout)


class _PythonGroup(dist.ProcessGroup):
    """A whole ``ProcessGroup`` written in Python (like PyTorch's ``threaded`` and
    ``dummy`` test backends), computing over an inner gloo group: every sum it returns
    is offset by 1000, so results show which engine computed them."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self.inner = dist.ProcessGroupGloo(store, rank, size, timeout)

    def getBackendName(self) -> str:  # noqa: N802 - c10d's name
        return "pyvendor"

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        work = self.inner.allreduce(tensors, opts or dist.AllreduceOptions())
        work.wait()
        for t in tensors:
            t.add_(1000)
        return work

    def allgather(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self.inner.allgather(outputs, inputs, opts or dist.AllgatherOptions())

    def _allgather_base(self, output: Any, input: Any, opts: Any = None) -> Any:
        return self.inner._allgather_base(output, input, opts or dist.AllgatherOptions())

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self.inner.broadcast(tensors, opts or dist.BroadcastOptions())

    def barrier(self, opts: Any = None) -> Any:
        return self.inner.barrier(opts or dist.BarrierOptions())

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        return self.inner.send(tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        return self.inner.recv(tensors, src, tag)

    def shutdown(self) -> None:
        # PyTorch's tests check such flags on the group after destroy_process_group.
        self.was_shut_down = True
        self.inner.shutdown()


def _python_creator(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    _CALLS.setdefault("pyvendor", []).append([rank, size, timeout.total_seconds()])
    return _PythonGroup(store, rank, size, timeout)


def _extended_creator(opts: Any, backend_options: Any) -> Any:
    """The extended API: c10d passes ``_DistributedBackendOptions`` and the pg_options."""
    _CALLS.setdefault("extvendor", []).append(
        [
            opts.group_rank,
            opts.group_size,
            opts.timeout.total_seconds(),
            list(opts.global_ranks_in_group),
            bool(opts.group_id),
            backend_options,
        ]
    )
    return dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)


def _register() -> None:
    for name, creator, extended in (
        ("vendorcc", _gloo_creator, False),
        ("pyvendor", _python_creator, False),
        ("extvendor", _extended_creator, True),
    ):
        if name.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(name, creator, extended_api=extended, devices=["cpu"])


def _user_code(backend: str, switched: bool) -> dict[str, Any]:
    """What a user of ``backend`` does: a default group, collectives, a subgroup."""
    rank, size = _rank(), _size()
    _CALLS.clear()
    saved = dist.config.use_torchcomms
    dist.config.use_torchcomms = switched
    try:
        dist.init_process_group(
            backend, store=_store(), rank=rank, world_size=size, timeout=timedelta(seconds=45)
        )
        try:
            world = dist.group.WORLD
            out: dict[str, Any] = {
                "wrapper": type(world).__name__ == "_BackendWrapper",
                "get_backend": dist.get_backend(),
                "rank_size": [dist.get_rank(), dist.get_world_size()],
            }
            big = torch.arange(4 * 1024 * 1024, dtype=torch.float32) + rank  # 16 MiB
            dist.all_reduce(big)
            out["all_reduce_big"] = [big[0].item(), big[-1].item(), big.sum().item()]
            gathered = [torch.zeros(3) for _ in range(size)]
            dist.all_gather(gathered, torch.full((3,), float(rank)))
            out["all_gather"] = [t.tolist() for t in gathered]
            value = torch.full((5,), float(rank + 7))
            dist.broadcast(value, src=size - 1)
            out["broadcast"] = value.tolist()
            dist.barrier()
            if size >= 2:
                msg = torch.zeros(2)
                if rank == 0:
                    dist.send(torch.tensor([3.0, 4.0]), dst=1)
                elif rank == 1:
                    dist.recv(msg, src=0)
                out["recv"] = msg.tolist()
            sub_ranks = list(range(0, size, 2))
            sub = dist.new_group(sub_ranks)
            if rank in sub_ranks:
                t = torch.ones(2) * (rank + 1)
                dist.all_reduce(t, group=sub)
                out["subgroup"] = [t.tolist(), dist.get_rank(sub), dist.get_world_size(sub)]
            out["creator_calls"] = [list(c) for c in _CALLS.get(backend, [])]
            out["backend_name"] = [world.name(), dist.get_backend(world)]
        finally:
            dist.destroy_process_group()
        # The engine's own state, read through the group as c10d code reads it.
        out["shut_down"] = getattr(world, "was_shut_down", None)
        return out
    finally:
        dist.config.use_torchcomms = saved


def body_registered_backend(backend: str) -> dict[str, Any]:
    _register()
    return {"plain": _user_code(backend, False), "switched": _user_code(backend, True)}


@pytest.mark.parametrize("backend", ["vendorcc", "pyvendor", "extvendor"])
def test_a_c10d_registered_backend_works_under_the_switch_as_without_it(pool, backend) -> None:
    results = pool.run(body_registered_backend, backend, timeout=180)
    size = pool.world_size
    for rank, res in enumerate(results):
        plain, switched = res["plain"], res["switched"]
        assert not plain["wrapper"] and switched["wrapper"] == WRAPS_FOREIGN
        switched.pop("wrapper"), plain.pop("wrapper")
        # Same results, same ranks, the creator called with the same arguments.
        assert switched == plain, f"rank {rank}: plain {plain} but switched {switched}"
        # ...and right, so that agreeing on a wrong answer cannot pass.
        n = 4 * 1024 * 1024
        offset = 1000 if backend == "pyvendor" else 0
        expected_first = sum(range(size)) + offset
        assert plain["all_reduce_big"][0] == expected_first
        assert plain["all_reduce_big"][1] == size * (n - 1) + sum(range(size)) + offset
        assert plain["all_gather"] == [[float(r)] * 3 for r in range(size)]
        assert plain["broadcast"] == [float(size - 1 + 7)] * 5
        assert plain["recv"] == ([3.0, 4.0] if rank == 1 else [0.0, 0.0])
        assert plain["get_backend"] == backend
        assert plain["shut_down"] == (True if backend == "pyvendor" else None)
        if backend == "pyvendor":
            assert plain["backend_name"] == ["pyvendor", "pyvendor"]  # its getBackendName
        if rank % 2 == 0:
            members = len(range(0, size, 2))
            total = sum(r + 1 for r in range(0, size, 2)) + offset
            assert plain["subgroup"] == [[float(total)] * 2, rank // 2, members]
        calls = plain["creator_calls"]
        # The world, then the subgroup for its members (c10d makes it for members only;
        # the switch splits it from the world's communicator, on the same creator).
        assert calls[0][:3] == [rank, size, 45.0]
        if backend == "extvendor":
            assert calls[0][3:] == [[], True, None]  # c10d gives the world no list
            if rank % 2 == 0:
                assert calls[1][3] == list(range(0, size, 2))


def body_unknown_backend() -> list[str]:
    saved = dist.config.use_torchcomms
    dist.config.use_torchcomms = True
    try:
        dist.init_process_group("nosuchvendor", store=_store(), rank=_rank(), world_size=_size())
    except Exception as exc:  # noqa: BLE001 - the error is what is checked
        return [type(exc).__name__, str(exc)]
    finally:
        dist.config.use_torchcomms = saved
    dist.destroy_process_group()
    return ["no error"]


def test_a_backend_neither_torchcomms_nor_c10d_knows_is_refused_clearly(pool2) -> None:
    for kind, message in pool2.run(body_unknown_backend, timeout=60):
        assert kind != "no error"
        assert "nosuchvendor" in message


# -- PyTorch's own threaded backend (MultiThreadedTestCase's), in threads of one process ----

_THREADED = textwrap.dedent(
    """
    import sys, threading
    import torch, torch.distributed as dist
    import torchcomms
    from torch.testing._internal.distributed import multi_threaded_pg as mtpg

    # The switch comes from the environment (dist.config set at run time is per thread).
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    mtpg._install_threaded_pg()
    store = dist.HashStore()
    size = 4
    results, errors = {}, []

    def rank_main(rank):
        try:
            dist.init_process_group("threaded", rank=rank, world_size=size, store=store)
            try:
                t = torch.full((3,), float(rank + 1))
                dist.all_reduce(t)
                g = [torch.zeros(2) for _ in range(size)]
                dist.all_gather(g, torch.full((2,), float(rank)))
                b = torch.full((2,), float(rank))
                dist.broadcast(b, src=2)
                sub = dist.new_group([0, 1]) if True else None
                s = torch.ones(1) * (rank + 1)
                if rank in (0, 1):
                    dist.all_reduce(s, group=sub)
                import torch.distributed._functional_collectives as funcol
                w = dist.group.WORLD
                f = funcol.all_reduce(torch.ones(2) * rank, "sum", w)
                ag = funcol.all_gather_tensor(torch.full((2,), float(rank)), 0, w)
                rs = funcol.reduce_scatter_tensor(torch.arange(8.0) * (rank + 1), "sum", 0, w)
                a2a = funcol.all_to_all_single(
                    torch.arange(4.0) + 10 * rank, [1, 1, 1, 1], [1, 1, 1, 1], w
                )
                results[rank] = [
                    type(w).__name__,
                    t.tolist(), [x.tolist() for x in g], b.tolist(), s.tolist(), f.tolist(),
                    ag.tolist(), rs.tolist(), a2a.tolist(),
                ]
            finally:
                dist.destroy_process_group()
        except BaseException as exc:
            errors.append(f"rank {rank}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(size)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    print(repr({"results": results, "errors": errors}))
    """
)


def _threaded(switched: bool) -> dict[str, Any]:
    env = {**os.environ, "TORCHCOMM_ABORT_ON_ERROR": "false"}
    for key in ("TORCHCOMM_RANK", "TORCHCOMM_SIZE", "RANK", "WORLD_SIZE"):
        env.pop(key, None)
    env["TORCH_DISTRIBUTED_USE_TORCHCOMMS"] = "1" if switched else "0"
    done = subprocess.run(
        [sys.executable, "-c", _THREADED],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    import ast

    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def test_pytorchs_threaded_backend_works_under_the_switch_as_without_it() -> None:
    plain, switched = _threaded(False), _threaded(True)
    assert plain["errors"] == [] and switched["errors"] == [], (plain, switched)
    for rank in range(4):
        kind_plain, *seen_plain = plain["results"][rank]
        kind_switched, *seen_switched = switched["results"][rank]
        assert kind_plain == "ProcessLocalGroup"
        assert kind_switched == ("_BackendWrapper" if WRAPS_FOREIGN else "ProcessLocalGroup")
        assert seen_switched == seen_plain, (rank, seen_plain, seen_switched)
        assert seen_plain[0] == [10.0] * 3
        assert seen_plain[2] == [2.0, 2.0]
        assert seen_plain[3] == ([3.0] if rank in (0, 1) else [float(rank + 1)])
        assert seen_plain[4] == [6.0, 6.0]
        assert seen_plain[5] == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
        assert seen_plain[6] == [10.0 * 2 * rank, 10.0 * (2 * rank + 1)]
        assert seen_plain[7] == [float(rank + 10 * r) for r in range(4)]


# -- a Python ProcessGroup that does not communicate (test_c10d_common's "dummy") ---------

_DUMMY = textwrap.dedent(
    """
    import sys
    import torch, torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    import torchcomms

    class DummyWork(dist._Work):
        def wait(self, timeout=None):
            return True

    class DummyProcessGroup(dist.ProcessGroup):
        # Each operation marks its tensors, so results show that this group ran them.
        def getBackendName(self):
            return "Dummy"
        def allgather(self, outs, ins, opts=None):
            for out_list, t in zip(outs, ins):
                for o in out_list:
                    o.copy_(t)
            return DummyWork()
        def allreduce(self, ts, opts=None):
            for t in ts:
                t.add_(2)
            return DummyWork()
        def barrier(self, opts=None):
            return DummyWork()
        def broadcast(self, ts, opts=None):
            for t in ts:
                t.add_(1)
            return DummyWork()
        def reduce_scatter(self, outs, ins, opts=None):
            for o, in_list in zip(outs, ins):
                o.copy_(in_list[self.rank()])
            return DummyWork()
        def send(self, ts, dst, tag=0):
            for t in ts:
                t.add_(1)
            return DummyWork()
        def shutdown(self):
            self._shutdown = True
        def abort(self):
            self._aborted = True

    dist.Backend.register_backend("dummy", lambda s, r, w, t: DummyProcessGroup(r, w))
    dist.config.use_torchcomms = sys.argv[1] == "1"
    out = []
    dist.init_process_group("dummy", rank=0, world_size=1, store=dist.HashStore())
    pg = c10d._get_default_group()
    out.append(type(pg).__name__)
    outs = [torch.zeros(2, 2)]
    dist.all_gather(outs, torch.ones(2, 2) * 7)
    out.append(outs[0].tolist())
    t = torch.ones(2, 2) * 7
    dist.all_reduce(t)
    out.append(t.tolist())
    t = torch.zeros(2, 2)
    dist.broadcast(t, 0, async_op=True).wait()
    out.append(t.tolist())
    o = torch.zeros(2, 2)
    dist.reduce_scatter(o, [torch.full((2, 2), 5.0)])
    out.append(o.tolist())
    dist.barrier()
    out.append([pg.name(), dist.get_backend(pg)])
    dist.destroy_process_group()
    out.append(getattr(pg, "_shutdown", None))
    dist.init_process_group("dummy", rank=0, world_size=1, store=dist.HashStore())
    pg = c10d._get_default_group()
    c10d._abort_process_group()
    out.append(getattr(pg, "_aborted", None))
    print(repr(out))
    """
)


def _dummy(switched: bool) -> list[Any]:
    env = {**os.environ, "TORCHCOMM_ABORT_ON_ERROR": "false"}
    done = subprocess.run(
        [sys.executable, "-c", _DUMMY, "1" if switched else "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    import ast

    result: list[Any] = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    return result


def test_a_python_group_that_does_not_communicate_keeps_its_semantics() -> None:
    """PyTorch's c10d tests register such a ``dummy`` group: what its operations do to
    the tensors, and the flags its shutdown and abort set, read through the group."""
    plain, switched = _dummy(False), _dummy(True)
    assert plain[0] == "DummyProcessGroup"
    assert switched[0] == ("_BackendWrapper" if WRAPS_FOREIGN else "DummyProcessGroup")
    assert switched[1:] == plain[1:]
    assert plain[1:] == [
        [[7.0, 7.0], [7.0, 7.0]],
        [[9.0, 9.0], [9.0, 9.0]],
        [[1.0, 1.0], [1.0, 1.0]],
        [[5.0, 5.0], [5.0, 5.0]],
        ["Dummy", "dummy"],
        True,
        True,
    ]


# -- the engine's own methods (gloo's create_device), reached through the group ------------


def _engine_methods(switched: bool) -> dict[str, Any]:
    rank, size = _rank(), _size()
    saved = dist.config.use_torchcomms
    dist.config.use_torchcomms = switched
    try:
        dist.init_process_group("gloo", store=_store(), rank=rank, world_size=size)
        try:
            pg = dist.distributed_c10d._get_default_group()
            backend = pg._get_backend(torch.device("cpu"))
            out: dict[str, Any] = {"wrapper": type(pg).__name__ == "_BackendWrapper"}
            device = backend.create_device(interface="lo")
            out["device"] = type(device).__name__
            out["default_device"] = type(backend.create_default_device()).__name__
            out["options_class"] = backend.Options.__name__
            # broadcast_coalesced, as DDP's and c10d's gloo tests call it.
            tensors = [torch.full((n,), float(rank * 10 + n)) for n in (1, 5, 300_000)]
            dist._broadcast_coalesced(pg, tensors, 256 * 1024, 1)
            out["broadcast_coalesced"] = [[t[0].item(), t.numel()] for t in tensors]
            try:
                backend.no_such_method  # noqa: B018 - the lookup is the test
                out["missing"] = "found"
            except AttributeError as exc:
                out["missing"] = "AttributeError"
                out["missing_names_it"] = "no_such_method" in str(exc)
            return out
        finally:
            dist.destroy_process_group()
    finally:
        dist.config.use_torchcomms = saved


def body_engine_methods() -> dict[str, Any]:
    return {"plain": _engine_methods(False), "switched": _engine_methods(True)}


def test_gloo_methods_of_the_groups_backend_are_reachable(pool2) -> None:
    for res in pool2.run(body_engine_methods, timeout=120):
        plain, switched = res["plain"], res["switched"]
        assert not plain.pop("wrapper") and switched.pop("wrapper")
        assert switched == plain
        assert plain["device"] == "Device" and plain["options_class"] == "Options"
        assert plain["broadcast_coalesced"] == [[11.0, 1], [15.0, 5], [300_010.0, 300_000]]
        assert plain["missing"] == "AttributeError" and plain["missing_names_it"]


def body_engine_state_refused() -> str:
    saved = dist.config.use_torchcomms
    dist.config.use_torchcomms = True
    try:
        dist.init_process_group("gloo", store=_store(), rank=_rank(), world_size=_size())
        try:
            backend = dist.group.WORLD._get_backend(torch.device("cpu"))
            try:
                backend.shrink  # noqa: B018
            except AttributeError as exc:
                return str(exc)
            return "handed out"
        finally:
            dist.destroy_process_group()
    finally:
        dist.config.use_torchcomms = saved


def test_engine_state_the_communicator_owns_is_not_handed_out(pool2) -> None:
    for message in pool2.run(body_engine_state_refused, timeout=60):
        assert "shrink" in message and "communicator" in message


# -- local synchronization: PyTorch's switch refuses new_group(use_local_synchronization=True)


def _local_sync(switched: bool) -> dict[str, Any]:
    """What the sub-group object collectives of PyTorch's tests do, through the route the
    docs give while ``new_group`` refuses it under the switch."""
    rank, size = _rank(), _size()
    saved = dist.config.use_torchcomms
    dist.config.use_torchcomms = switched
    try:
        dist.init_process_group("gloo", store=_store(), rank=rank, world_size=size)
        try:
            out: dict[str, Any] = {}
            try:
                dist.new_group([0, 1], use_local_synchronization=True)
                out["new_group"] = "ok"
            except NotImplementedError as exc:
                out["new_group"] = "NotImplementedError" if "split_group" in str(exc) else str(exc)
            base = rank - rank % 2
            ranks = [base, base + 1]
            # Only the members call: ranks 0-1 and 2-3 each make their own pair.
            pg = dist.distributed_c10d._new_group_with_tag(ranks, use_local_synchronization=True)
            gathered: list[Any] = [None, None]
            dist.all_gather_object(gathered, {"rank": rank}, group=pg)
            out["gathered"] = gathered
            out["group_rank"] = dist.get_rank(pg)
            return out
        finally:
            dist.destroy_process_group()
    finally:
        dist.config.use_torchcomms = saved


def body_local_sync() -> dict[str, Any]:
    return {"plain": _local_sync(False), "switched": _local_sync(True)}


def test_local_synchronization_works_through_new_group_with_tag(pool4) -> None:
    for rank, res in enumerate(pool4.run(body_local_sync, timeout=180)):
        plain, switched = res["plain"], res["switched"]
        # PyTorch 2.13's own refusal under the switch (docs/pytorch-integration.md); 2.14
        # takes it.
        assert plain.pop("new_group") == "ok"
        local_sync = torch_compat.SWITCH_LOCAL_SYNCHRONIZATION
        assert switched.pop("new_group") == ("ok" if local_sync else "NotImplementedError")
        assert switched == plain
        base = rank - rank % 2
        assert plain["gathered"] == [{"rank": base}, {"rank": base + 1}]
        assert plain["group_rank"] == rank % 2


# -- reduce_scatter's list form with blocks of different sizes (gloo takes them) -----------


def _uneven_reduce_scatter(switched: bool) -> dict[str, Any]:
    """``dist.reduce_scatter(output, input_list)`` where block ``r`` is sized for rank
    ``r``'s output, as PyTorch's gloo test does: sizes 0, 16 MiB and odd ones."""
    rank, size = _rank(), _size()
    saved = dist.config.use_torchcomms
    dist.config.use_torchcomms = switched
    try:
        dist.init_process_group("gloo", store=_store(), rank=rank, world_size=size)
        try:
            out: dict[str, Any] = {"wrapper": type(dist.group.WORLD).__name__ == "_BackendWrapper"}
            numels = [0, 4 * 1024 * 1024 + 1, 3, 7][:size]
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
                blocks = [
                    torch.arange(n, dtype=torch.float32) * (rank + 1) + r
                    for r, n in enumerate(numels)
                ]
                result = torch.full((numels[rank],), -1.0)
                dist.reduce_scatter(result, blocks, op=op, async_op=True).wait()
                key = str(op).rsplit(".", 1)[-1]
                out[key] = [result.numel(), result.sum().item(), result[-1:].tolist()]
            # Integers and a 2-D output: the list form keeps each block's shape.
            ints = [torch.full((r + 1, 2), rank + r, dtype=torch.int64) for r in range(size)]
            got = torch.zeros((rank + 1, 2), dtype=torch.int64)
            dist.reduce_scatter(got, ints)
            out["int64_2d"] = got.tolist()
            # This rank's block must still fit its output: both refuse it.
            bad = [torch.ones(numels[r] + (1 if r == rank else 0)) for r in range(size)]
            try:
                dist.reduce_scatter(torch.zeros(numels[rank]), bad)
                out["bad"] = "accepted"
            except RuntimeError:
                out["bad"] = "RuntimeError"
            dist.barrier()
            return out
        finally:
            dist.destroy_process_group()
    finally:
        dist.config.use_torchcomms = saved


def body_uneven_reduce_scatter() -> dict[str, Any]:
    return {"plain": _uneven_reduce_scatter(False), "switched": _uneven_reduce_scatter(True)}


def test_reduce_scatter_with_blocks_of_different_sizes_works_as_on_gloo(pool: Any) -> None:
    size = pool.world_size
    numels = [0, 4 * 1024 * 1024 + 1, 3, 7][:size]
    for rank, res in enumerate(pool.run(body_uneven_reduce_scatter, timeout=180)):
        plain, switched = res["plain"], res["switched"]
        assert not plain.pop("wrapper") and switched.pop("wrapper")
        assert switched == plain, f"rank {rank}: plain {plain} but switched {switched}"
        n = numels[rank]
        ar = torch.arange(n, dtype=torch.float64)
        total = sum(q + 1 for q in range(size))
        assert plain["SUM"][0] == n
        assert plain["SUM"][1] == pytest.approx((ar * total + rank * size).sum().item())
        assert plain["MAX"][1] == pytest.approx((ar * size + rank).sum().item())
        assert plain["int64_2d"] == [[size * rank + total - size] * 2] * (rank + 1)
        assert plain["bad"] == "RuntimeError"

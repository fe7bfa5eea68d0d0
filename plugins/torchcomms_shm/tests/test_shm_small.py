"""The shm backend's memoryview path for small collectives, on real rank processes.

Every result is compared bit for bit with the general path's (a second communicator with
``small_bytes=0`` on the same inputs): every dtype and reduction, NaN, infinities, signed
zeros, float32 overflow and integer wrap-around; through ``comm.all_reduce`` (the lean
lane), the methods (asynchronous calls) and ``torch.distributed`` under PyTorch's switch
(backend ``cpu:shm``). Faults during small calls (SIGKILL, abort) are in
``test_shm_backend.py``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sysconfig
from datetime import timedelta
from typing import Any

import pytest
import torch

import torchcomms
from torchcomms import ReduceOp
from torchcomms_core.testing import RankPool, current_rank, unique_name

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
SIZES = (1, 2, 3, 17, 33, 100, 4099)


def _comm(prefix: str, **hints: str) -> torchcomms.TorchComm:
    return torchcomms.new_comm(
        "shm",
        torch.device("cpu"),
        name=unique_name(prefix),
        timeout=timedelta(seconds=60),
        abort_process_on_timeout_or_error=False,
        hints=hints,
    )


def _inputs(rank: int, count: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Values that exercise the edges: random, plus NaN, infinities, zeros of both signs,
    float32's largest values (sums overflow) and integers near their type's limits."""
    g = torch.Generator().manual_seed(seed * 131 + rank)
    if dtype.is_floating_point:
        t = (torch.randn(count, generator=g, dtype=torch.float64) * 100).to(dtype)
        specials = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 3.0e38, -3.0e38]
        pick = torch.randint(0, 3, (count,), generator=g) == 0
        idx = torch.randint(0, len(specials), (count,), generator=g)
        extra = torch.tensor(specials, dtype=torch.float64)[idx].to(dtype)
        return torch.where(pick, extra, t)
    info = torch.iinfo(dtype)
    t = torch.randint(info.min, info.max, (count,), generator=g, dtype=torch.int64)
    return t.to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, so NaN payloads and signed zeros compare too."""
    return t.contiguous().view(torch.uint8)


def _ops(dtype: torch.dtype) -> list[Any]:
    ops = [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MAX, ReduceOp.MIN]
    if dtype.is_floating_point:
        ops.append(ReduceOp.AVG)
    else:
        ops += [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
    return ops


def body_exact(native: str) -> list[str]:
    """The memoryview path (and the compiled small all-reduce, ``native``: ``true``,
    ``false`` or ``mixed``, rank 0 only) against the general path, bit for bit; returns
    mismatches."""
    r = current_rank()
    fast = _comm("small", native=native if native != "mixed" else str(r == 0).lower())
    python = _comm("python", native="false")
    slow = _comm("general", small_bytes="0")
    bad: list[str] = []
    for dtype in FLOATS + INTS:
        for op in _ops(dtype):
            for count in SIZES:
                x = _inputs(r, count, dtype, count)
                ref = x.clone()
                slow.all_reduce(ref, op)
                lean = x.clone()
                fast.all_reduce(lean, op)  # the lean lane
                method = x.clone()
                fast.all_reduce(method, op, async_op=True).wait()  # the method
                in_python = x.clone()
                python.all_reduce(in_python, op)
                for label, got in (("lean", lean), ("method", method), ("python", in_python)):
                    if not torch.equal(_bits(got), _bits(ref)):
                        bad.append(f"all_reduce {label} {dtype} {op} {count}")
            x = _inputs(r, 5, dtype, 7)
            for root in range(fast.get_size()):
                a, b = x.clone(), x.clone()
                fast.broadcast(a, root)
                slow.broadcast(b, root)
                if not torch.equal(_bits(a), _bits(b)):
                    bad.append(f"broadcast {dtype} root {root}")
    n = fast.get_size()
    for count in (1, 3, 1000):
        mine = _inputs(r, count, torch.float32, 3)
        outs = [torch.empty(n * count) for _ in range(2)]
        fast.all_gather_single(outs[0], mine)
        slow.all_gather_single(outs[1], mine)
        if not torch.equal(_bits(outs[0]), _bits(outs[1])):
            bad.append(f"all_gather_single {count}")
        # In place: this rank's input is its block of the output.
        inplace = torch.zeros(n * count)
        inplace[r * count : (r + 1) * count] = mine
        fast.all_gather_single(inplace, inplace[r * count : (r + 1) * count])
        if not torch.equal(_bits(inplace), _bits(outs[1])):
            bad.append(f"all_gather_single in place {count}")
        lists = [[torch.empty(count + k) for k in range(n)] for _ in range(2)]
        own = _inputs(r, count + r, torch.float32, 4)
        fast.all_gather_v(lists[0], own)
        slow.all_gather_v(lists[1], own)
        for k in range(n):
            if not torch.equal(_bits(lists[0][k]), _bits(lists[1][k])):
                bad.append(f"all_gather_v {count} block {k}")
    # A tensor reused with new values, and one freed and replaced at once (the cache of
    # views must never answer for a tensor that is gone or was resized).
    t = torch.ones(4)
    for step in range(5):
        t.fill_(step + r)
        fast.all_reduce(t, ReduceOp.SUM)
        if t.tolist() != [float(n * step + n * (n - 1) // 2)] * t.numel():
            bad.append(f"reused tensor step {step}: {t.tolist()}")
        t = torch.ones(4 + step)
    t = torch.ones(2)
    fast.all_reduce(t, ReduceOp.SUM)
    t.resize_(8).fill_(1.0)
    fast.all_reduce(t, ReduceOp.SUM)
    if t.tolist() != [float(n)] * 8:
        bad.append(f"resized tensor: {t.tolist()}")
    fast.barrier()
    uses_native = fast.get_backend_impl()._small.native is not None
    uses_fastcall = fast.get_backend_impl()._small.fastcall is not None
    fast.finalize()
    python.finalize()
    slow.finalize()
    if native == "true" and shutil.which("cc") and uses_native is False:
        bad.append("a C compiler is here but the compiled small all-reduce did not load")
    headers = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    if native == "true" and shutil.which("cc") and headers and not uses_fastcall:
        bad.append("the interpreter's headers are here but the CPython entry did not load")
    return bad


@pytest.mark.parametrize(("world_size", "native"), [(2, "true"), (4, "true"), (4, "mixed")])
def test_the_memoryview_path_gives_the_general_paths_bits(world_size: int, native: str) -> None:
    """Also the compiled small all-reduce, and ranks that mix it with the memoryview path
    (the two follow one protocol and fold in one order)."""
    with RankPool(world_size) as pool:
        for bad in pool.run(body_exact, native, timeout=600):
            assert bad == []


def body_switch() -> dict[str, Any]:
    """``torch.distributed`` under PyTorch's switch on ``cpu:shm``: plain calls take the
    communicator lane (a completed work of its own), others the general path."""
    import torch.distributed as dist

    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=60),
    )
    saved = dist.config.use_torchcomms
    dist.config.use_torchcomms = True
    os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
    try:
        dist.init_process_group(
            "cpu:shm",
            store=dist.PrefixStore(unique_name("switch"), store),
            rank=int(os.environ["TORCHCOMM_RANK"]),
            world_size=int(os.environ["TORCHCOMM_SIZE"]),
        )
    finally:
        dist.config.use_torchcomms = saved
    try:
        pg = dist.group.WORLD
        r, n = dist.get_rank(), dist.get_world_size()
        out: dict[str, Any] = {}
        results = []
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.AVG):
            t = torch.tensor([r + 1.0, -r - 0.5])
            dist.all_reduce(t, op=op)
            results.append(t.tolist())
        out["results"] = results
        opts = dist.AllreduceOptions()
        opts.asyncOp = False
        t = torch.ones(3)
        work = pg.allreduce([t], opts)
        out["sync work"] = type(work).__name__
        out["sync future"] = work.get_future().wait()[0].tolist()
        work = dist.all_reduce(t, async_op=True)
        out["async work"] = type(work).__name__
        work.wait()
        out["after async"] = t.tolist()
        b = torch.full((2,), float(r))
        dist.broadcast(b, src=n - 1)
        out["broadcast"] = b.tolist()
        return out
    finally:
        dist.destroy_process_group()


def test_torch_distributed_under_the_switch_takes_the_communicator_lane(pool2: RankPool) -> None:
    for out in pool2.run(body_switch, timeout=120):
        assert out["results"] == [[3.0, -2.0], [2.0, -0.5], [1.0, -1.5], [1.5, -1.0]]
        assert out["sync work"] == "DoneWork"
        assert out["sync future"] == [2.0, 2.0, 2.0]
        assert out["async work"] == "CommWork"
        assert out["after async"] == [4.0, 4.0, 4.0]
        assert out["broadcast"] == [1.0, 1.0]


def body_direct_copies() -> list[str]:
    """Broadcast and all-gather read straight from the owners' tensors when the choice is
    ``direct`` (forced by hint): the same bytes as staging, uneven and in place too."""
    direct = _comm("direct", **{"algorithm.broadcast": "direct", "algorithm.all_gather": "direct"})
    staged = _comm("staged", **{"algorithm.broadcast": "staged", "algorithm.all_gather": "staged"})
    impl = direct.get_backend_impl()
    r, n = direct.get_rank(), direct.get_size()
    bad: list[str] = []
    if not impl._cma_ok:
        return ["skip: cross-memory reads not permitted here"]
    for count in (1, 1000, (3 << 20) + 5):
        for root in range(n):
            a = _inputs(r, count, torch.float32, root)
            b = a.clone()
            direct.broadcast(a, root)
            staged.broadcast(b, root)
            if (
                not torch.equal(_bits(a), _bits(b))
                or direct.get_backend_impl().tuning.last["broadcast"].algorithm != "direct"
            ):
                bad.append(f"broadcast {count} root {root}")
        mine = _inputs(r, count, torch.float32, 9)
        outs = [torch.empty(n * count) for _ in range(2)]
        direct.all_gather_single(outs[0], mine)
        staged.all_gather_single(outs[1], mine)
        if not torch.equal(_bits(outs[0]), _bits(outs[1])):
            bad.append(f"all_gather_single {count}")
        inplace = outs[1].clone()
        inplace[r * count : (r + 1) * count] = mine
        direct.all_gather_single(inplace, inplace[r * count : (r + 1) * count])
        if not torch.equal(_bits(inplace), _bits(outs[1])):
            bad.append(f"all_gather_single in place {count}")
        lists = [[torch.empty(count + k) for k in range(n)] for _ in range(2)]
        own = _inputs(r, count + r, torch.float32, 4)
        direct.all_gather_v(lists[0], own)
        staged.all_gather_v(lists[1], own)
        for k in range(n):
            if not torch.equal(_bits(lists[0][k]), _bits(lists[1][k])):
                bad.append(f"all_gather_v {count} block {k}")
    direct.finalize()
    staged.finalize()
    return bad


@pytest.mark.parametrize("world_size", [2, 4])
def test_direct_broadcast_and_all_gather_give_stagings_bytes(world_size: int) -> None:
    with RankPool(world_size) as pool:
        for bad in pool.run(body_direct_copies, timeout=300):
            assert bad in ([], ["skip: cross-memory reads not permitted here"])
            if bad:
                pytest.skip(bad[0])


def body_without_compiler() -> dict[str, Any]:
    comm = _comm("nocc")
    r, n = comm.get_rank(), comm.get_size()
    t = torch.tensor([1.5 + r, -2.0 * r], dtype=torch.float32)
    comm.all_reduce(t, ReduceOp.SUM)
    native_loaded = comm.get_backend_impl()._small.native is not None
    comm.finalize()
    expected = [sum(1.5 + k for k in range(n)), sum(-2.0 * k for k in range(n))]
    return {"ok": t.tolist() == expected, "native": native_loaded}


@pytest.mark.parametrize("how", ["failing compiler", "switched off", "cache writable by others"])
def test_without_the_compiled_path_small_all_reduces_run_in_python(
    how: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiler that fails (or ``TORCHCOMM_SHM_NATIVE=0``, or a cache directory other
    users may write) leaves the memoryview path, with the same results; a failed build
    leaves nothing in the cache."""
    monkeypatch.setenv("TORCHCOMM_CACHE_DIR", str(tmp_path))
    if how == "failing compiler":
        monkeypatch.setenv("CC", shutil.which("false") or "/bin/false")
    elif how == "switched off":
        monkeypatch.setenv("TORCHCOMM_SHM_NATIVE", "0")
    else:  # another user could put code there: built, but never loaded
        if not shutil.which("cc"):
            pytest.skip("no C compiler here")
        (tmp_path / "native").mkdir(mode=0o777)
        (tmp_path / "native").chmod(0o777)
    with RankPool(2) as pool:
        for res in pool.run(body_without_compiler, timeout=120):
            assert res == {"ok": True, "native": False}
    if how != "cache writable by others":
        assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def body_measured(calls: int) -> dict[str, Any]:
    """``measured`` (the default from 1 MiB): every call's result exact, whichever path
    rank 0 chose, with roots, sizes, in-place and uneven blocks varying call by call and
    asynchronous calls queued behind each other."""
    comm = _comm("measured")
    impl = comm.get_backend_impl()
    r, n = comm.get_rank(), comm.get_size()
    if not impl._cma_ok:
        return {"skip": "cross-memory reads not permitted here"}
    bad: list[str] = []
    chosen: set[str] = set()
    for i in range(calls):
        count = (1 << 18) + (i % 3) * 1001  # 1 MiB and up, in three buckets' reach
        root = i % n
        a = _inputs(r, count, torch.float32, root + 100 * (i % 3))
        want = _inputs(root, count, torch.float32, root + 100 * (i % 3))
        work = comm.broadcast(a, root, async_op=bool(i % 2))
        if work is not None:
            work.wait()
        chosen.add(impl.tuning.last["broadcast"].algorithm)
        if not torch.equal(_bits(a), _bits(want)):
            bad.append(f"broadcast call {i} root {root}")
        mine = _inputs(r, count, torch.float32, i)
        out = torch.empty(n * count)
        if i % 4 == 3:  # in place: this rank's input is its block of the output
            out[r * count : (r + 1) * count] = mine
            comm.all_gather_single(out, out[r * count : (r + 1) * count])
        else:
            comm.all_gather_single(out, mine)
        for p in range(n):
            if not torch.equal(
                _bits(out[p * count : (p + 1) * count]), _bits(_inputs(p, count, torch.float32, i))
            ):
                bad.append(f"all_gather call {i} block {p}")
    meter = impl._coll.meter
    # The buckets of the first size: the tensor's bytes, and all_gather's output bytes.
    timed = {
        "broadcast": meter.averages(("broadcast", ((1 << 20) - 1).bit_length())),
        "all_gather": meter.averages(("all_gather", ((n << 20) - 1).bit_length())),
    }
    comm.finalize()
    return {"bad": bad, "chosen": sorted(chosen), "timed": timed, "rank": r}


@pytest.mark.parametrize("world_size", [2, 4])
def test_measured_copies_are_exact_whichever_path_rank0_takes(world_size: int) -> None:
    """Enough calls that rank 0 times both paths of each bucket and explores again."""
    from torchcomms_shm.measured import EXPLORE

    with RankPool(world_size) as pool:
        results = pool.run(body_measured, EXPLORE + 6, timeout=600)
    for res in results:
        if "skip" in res:
            pytest.skip(res["skip"])
        assert res["bad"] == []
        assert res["chosen"] == ["measured"]
    timed = next(res["timed"] for res in results if res["rank"] == 0)
    # Rank 0 timed both paths of the first size's bucket of each operation.
    for op in ("broadcast", "all_gather"):
        staged, direct = timed[op]
        assert staged is not None and direct is not None and staged > 0 and direct > 0, timed


#: Mid and large sizes (elements): within one piece, exactly a piece, and several pieces
#: of half a slot (128 Ki float32 elements with the 1 MiB arena) with a short last one.
ONE_STEP_COUNTS = (16 << 10, 64 << 10, (128 << 10) + 0, (3 << 17) + 5)


def body_one_step(native: str) -> dict[str, Any]:
    """The one-step all-reduce at mid and large sizes (compiled, pieces of half a slot, or
    torch's fold per piece where ``native`` is false or mixed) against the chunked path, for
    the dtypes the compiled fold covers and the ones it leaves to torch: the compiled
    dtypes' SUM bit for bit; MAX, and bfloat16, value for value (torch's choice between 0.0
    and -0.0, and bfloat16's NaN payloads, depend on where its vector lanes fall, which
    differs between the two paths' partitions). Returns the mismatches and a digest of
    every one-step result, which every rank must share."""
    r = current_rank()
    mine = native if native != "mixed" else str(r % 2 == 0).lower()
    one = _comm("onestep", **{"algorithm.all_reduce": "one_step", "native": mine})
    chunked = _comm("chunked", **{"algorithm.all_reduce": "chunked"})
    bad: list[str] = []
    digest = hashlib.sha256()
    dtypes = (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16)
    for dtype in dtypes:
        for op in (ReduceOp.SUM, ReduceOp.MAX):
            for count in ONE_STEP_COUNTS:
                x = _inputs(r, count, dtype, count + 1)
                ref, got = x.clone(), x.clone()
                chunked.all_reduce(ref, op)
                one.all_reduce(got, op)
                if op == ReduceOp.SUM and dtype != torch.bfloat16:
                    same = torch.equal(_bits(got), _bits(ref))
                else:
                    both_nan = got.isnan() & ref.isnan() if dtype.is_floating_point else False
                    same = bool(((got == ref) | both_nan).all())
                if not same:
                    bad.append(f"{dtype} {op} {count}")
                digest.update(_bits(got).numpy().tobytes())
                one.all_reduce(got.clone(), op, async_op=True).wait()  # the queued method
    # A new tensor of a size already seen shares the compiled plans (the address is the
    # tensor's own at every call).
    for step in range(3):
        t = torch.full((3 << 17,), float(r + step))
        one.all_reduce(t, ReduceOp.SUM)
        n = one.get_size()
        want = float(n * step + n * (n - 1) // 2)
        if not bool((t == want).all()):
            bad.append(f"new tensor step {step}")
    chose = one.get_backend_impl().tuning.last["all_reduce"].algorithm
    if chose != "one_step":
        bad.append(f"the forced choice was {chose}")
    one.finalize()
    chunked.finalize()
    return {"bad": bad, "digest": digest.hexdigest()}


@pytest.mark.parametrize(
    ("world_size", "native"), [(2, "true"), (3, "true"), (4, "true"), (3, "mixed")]
)
def test_one_step_at_mid_and_large_sizes_gives_the_chunked_paths_bits(
    world_size: int, native: str
) -> None:
    """Pieces of half a slot, each one step; ranks on the compiled path and ranks on torch's
    fold (``mixed``) take the same steps."""
    with RankPool(world_size) as pool:
        results = pool.run(body_one_step, native, timeout=600)
    for res in results:
        assert res["bad"] == []
    assert len({res["digest"] for res in results}) == 1  # every rank has the same bits


def body_size_mismatch(native: str) -> dict[str, Any]:
    """Ranks that pass different sizes to a one-step all-reduce all raise, naming the ranks
    and sizes, after the same step, on every path (compiled, memoryview, torch's fold,
    several pieces); a matching call right after is exact."""
    r = current_rank()
    mine = native if native != "mixed" else str(r % 2 == 0).lower()
    comm = _comm("mismatch", **{"algorithm.all_reduce": "one_step", "native": mine})
    n = comm.get_size()
    cases = {
        "compiled small (lean lane)": (torch.float32, 8 if r == 0 else 4),
        "compiled, pieces": (torch.float32, (1 << 18) if r == 0 else 100_000),
        "memoryview": (torch.int16, 100 if r == 0 else 50),
        "torch fold, pieces": (torch.bfloat16, (1 << 19) if r == 0 else 100_000),
    }
    out: dict[str, Any] = {}
    for name, (dtype, count) in cases.items():
        t = torch.ones(count, dtype=dtype)
        try:
            comm.all_reduce(t, ReduceOp.SUM)
            out[name] = "no error"
        except torchcomms.CommInputError as exc:
            out[name] = str(exc)
        ok = torch.ones(1000, dtype=dtype)
        comm.all_reduce(ok, ReduceOp.SUM)  # the communicator is still in step
        out[name + " after"] = bool((ok == n).all())
    comm.finalize()
    return out


@pytest.mark.parametrize(("world_size", "native"), [(2, "true"), (3, "mixed")])
def test_ranks_passing_different_sizes_to_one_step_all_raise_and_stay_in_step(
    world_size: int, native: str
) -> None:
    with RankPool(world_size) as pool:
        results = pool.run(body_size_mismatch, native, timeout=300)
    for res in results:
        for name, value in res.items():
            if name.endswith(" after"):
                assert value is True, (name, res)
            else:
                assert "bytes where rank" in value and "same size" in value, (name, value)

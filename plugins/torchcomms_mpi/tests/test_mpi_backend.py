"""The mpi backend (torchcomms-mpi): conformance under mpiexec, launch, dtypes, zero copy.

Ranks are MPI processes started by mpiexec (the ``mpi_pool`` fixture, 2 and 4 ranks);
every test skips with the reason where mpiexec or mpi4py is missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest
import torch

import torchcomms
from torchcomms import ReduceOp
from torchcomms_core.testing import run_conformance
from torchcomms_core.testing.mpi_launch import find_mpiexec, mpiexec_unavailable
from torchcomms_core.testing.pool import unique_name

_MISSING = mpiexec_unavailable()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"mpi backend: {_MISSING}")


def _clean_env() -> dict[str, str]:
    """The environment without any launcher's rank variables or rendezvous address."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHCOMM_", "MASTER_", "TORCHELASTIC_", "PMI_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    }


# -- the conformance suite, run as a vendor runs it ------------------------------------------


@pytest.mark.parametrize("world_size", [2, 4])
def test_mpi_passes_the_conformance_suite_under_mpiexec(world_size: int) -> None:
    res = run_conformance(
        "mpi", world_size, extra_args=["--torchcomms-launcher", "mpiexec"], env=_clean_env()
    )
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr[-2000:]
    assert "failed" not in res.stdout and "skipped" not in res.stdout
    assert f"'mpi' at {world_size} ranks" in res.stdout
    assert "derived: -" in res.stdout  # every operation is one MPI call


# -- launching -------------------------------------------------------------------------------

_SCRIPT = textwrap.dedent("""
    import torch, torchcomms
    comm = torchcomms.new_comm("mpi", torch.device("cpu"), name="main")
    t = torch.full((3,), float(comm.get_rank()))
    comm.all_reduce(t, torchcomms.ReduceOp.AVG, async_op=False)
    print(f"rank {comm.get_rank()} of {comm.get_size()}: {t.tolist()}", flush=True)
    comm.finalize()
""")


def test_mpiexec_launches_a_plain_script(tmp_path) -> None:
    script = tmp_path / "job.py"
    script.write_text(_SCRIPT)
    res = subprocess.run(
        [find_mpiexec(), "-n", "2", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_clean_env(),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "rank 0 of 2: [0.5, 0.5, 0.5]" in res.stdout
    assert "rank 1 of 2: [0.5, 0.5, 0.5]" in res.stdout


def test_without_mpiexec_the_error_says_to_use_it(tmp_path) -> None:
    script = tmp_path / "job.py"
    script.write_text(_SCRIPT)
    # A launcher that is not MPI says "rank 0 of 2", but MPI sees one process.
    env = {**_clean_env(), "TORCHCOMM_RANK": "0", "TORCHCOMM_SIZE": "2"}
    res = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert res.returncode != 0
    assert "BootstrapError" in res.stderr and "mpiexec -n 2 python script.py" in res.stderr
    res = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=_clean_env()
    )
    assert res.returncode != 0 and "mpiexec -n 2 python script.py" in res.stderr


# -- bodies ----------------------------------------------------------------------------------


def _comm():
    return torchcomms.new_comm("mpi", torch.device("cpu"), name=unique_name("mpi"))


def body_half_precision_reductions() -> list[str]:
    """bf16 (user-defined MPI op) and fp16 reduce exactly like torch does on one process."""
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    checked = []
    for dtype in (torch.bfloat16, torch.float16):
        inputs = [torch.tensor([1.5, -2.0, 0.25 * (k + 1), 3.0 + k], dtype=dtype) for k in range(n)]
        for op, ref in (
            (ReduceOp.SUM, lambda xs: sum(xs[1:], xs[0].clone())),
            (ReduceOp.MAX, lambda xs: torch.stack(xs).amax(0)),
            (ReduceOp.MIN, lambda xs: torch.stack(xs).amin(0)),
            (ReduceOp.PRODUCT, lambda xs: torch.stack(xs).prod(0)),
            (ReduceOp.AVG, lambda xs: sum(xs[1:], xs[0].clone()) / n),
        ):
            for async_op in (False, True):
                t = inputs[r].clone()
                comm.all_reduce(t, op, async_op=async_op).wait()
                expected = ref(inputs)
                assert t.dtype == dtype and torch.equal(t, expected), (dtype, op, t, expected)
        out = torch.empty(1, dtype=dtype)
        comm.reduce_scatter_single(out, torch.arange(n, dtype=dtype) + r, ReduceOp.SUM)
        assert out.item() == n * r + sum(range(n)), out
        checked.append(str(dtype))
    comm.finalize()
    return checked


def body_sync_and_async_mix_across_ranks(rounds: int) -> None:
    """Ranks choose async_op independently; MPI would not match blocking with nonblocking.

    Sizes alternate around TORCHCOMM_MPI_BLOCKING_BYTES (64 KiB): small collectives are
    blocking MPI calls and large ones nonblocking on every rank, whatever async_op says.
    """
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    works = []
    tensors = []
    sizes = (5, 16384, 16385, 40000)  # 20 B, exactly 64 KiB, just over, 160 KB
    for i in range(rounds):
        numel = sizes[i % len(sizes)]
        t = torch.full((numel,), float(i + r))
        work = comm.all_reduce(t, ReduceOp.SUM, async_op=(i + r) % 2 == 1)
        works.append(work)
        tensors.append(t)
        b = torch.full((numel,), float(r))
        works.append(comm.broadcast(b, i % n, async_op=(i + r) % 3 == 0))
        tensors.append((b, float(i % n)))
    for i, (w, t) in enumerate(zip(works, tensors, strict=True)):
        w.wait()
        assert w.is_completed()
        if isinstance(t, tuple):
            assert torch.equal(t[0], torch.full_like(t[0], t[1]))
        else:
            assert torch.equal(t, torch.full_like(t, float(n * (i // 2) + sum(range(n)))))
    comm.finalize()


def body_zero_copy_layouts() -> None:
    """Results land in the callers' tensors: separately allocated lists and in-place forms."""
    from torchcomms_mpi import buffers

    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    t = torch.zeros(4)
    assert buffers.buf(t)[0].address == t.data_ptr()  # MPI sees the tensor's own memory
    outs = [torch.empty(3) for _ in range(n)]  # n separate allocations
    comm.all_gather(outs, torch.full((3,), float(r)))
    assert [o[0].item() for o in outs] == [float(k) for k in range(n)]
    whole = torch.zeros(n * 2)
    mine = whole[2 * r : 2 * r + 2]
    mine.fill_(r + 1.0)
    comm.all_gather_single(whole, mine)  # in place: the input sits in this rank's slot
    assert whole.tolist() == [float(k + 1) for k in range(n) for _ in range(2)]
    a2a = torch.arange(n, dtype=torch.float32) + 10 * r
    comm.all_to_all_single(a2a, a2a)  # in place
    assert a2a.tolist() == [float(k * 10 + r) for k in range(n)]
    pieces = [torch.full((2,), float(r * 10 + k)) for k in range(n)]
    got = [torch.empty(2) for _ in range(n)]
    comm.all_to_all(got, pieces)
    assert [g[0].item() for g in got] == [float(k * 10 + r) for k in range(n)]
    scattered = [torch.full((2,), float(k)) for k in range(n)]  # not one run of memory
    red = torch.empty(2)
    comm.reduce_scatter(red, scattered, ReduceOp.SUM)
    assert red.tolist() == [float(r * n)] * 2
    comm.finalize()


def body_split_groups() -> list[int]:
    """Disjoint groups split at once (MPI_Comm_create_group); [] gets None; nesting works."""
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    evens = [k for k in range(n) if k % 2 == 0]
    odds = [k for k in range(n) if k % 2 == 1]
    sub = comm.split(evens if r % 2 == 0 else odds, "parity")
    t = torch.tensor([float(r)])
    sub.all_reduce(t, ReduceOp.SUM)
    assert t.item() == sum(evens if r % 2 == 0 else odds)
    solo = sub.split([0] if sub.get_rank() == 0 else [], "solo")
    assert (solo is None) == (sub.get_rank() != 0)
    if solo is not None:
        solo.barrier()
        solo.finalize()
    assert isinstance(sub.get_backend_impl().engine, __import__("mpi4py.MPI").MPI.Intracomm)
    sub.finalize()
    comm.finalize()
    return [sub.get_rank(), sub.get_size()]


def body_sync_timeout(seconds: float) -> dict:
    """A synchronous receive nobody answers raises a timeout instead of hanging."""
    comm = _comm()
    r = comm.get_rank()
    result: dict = {}
    if r == 0:
        start = time.monotonic()
        try:
            comm.recv(torch.empty(1), 1, async_op=False, timeout=timedelta(seconds=seconds))
        except torchcomms.CommTimeoutError as exc:
            result = {"message": str(exc), "seconds": time.monotonic() - start}
    else:
        time.sleep(seconds + 0.5)
    comm.abort()
    return result


def body_tags_and_any_source(numel: int) -> dict:
    """c10d's tags and receives from any source through the bridge, matched by MPI: two
    messages sent under different tags land in receives posted in the opposite order; a
    receive without a source names each sender; a tagged one takes only its tag."""
    import torch.distributed as dist

    from torchcomms.device_mesh import _create_torchcomm_process_group

    comm = _comm()
    pg = _create_torchcomm_process_group(comm, unique_name("mpitags"))
    me, n = comm.get_rank(), comm.get_size()
    out: dict = {}
    if me == 0:
        a, b = torch.full((numel,), 1.0), torch.full((numel,), 2.0)
        for w in [dist.isend(a, 1, group=pg, tag=7), dist.isend(b, 1, group=pg, tag=9)]:
            w.wait()
    elif me == 1:
        first, second = torch.zeros(numel), torch.zeros(numel)
        for w in [dist.irecv(first, 0, group=pg, tag=9), dist.irecv(second, 0, group=pg, tag=7)]:
            w.wait()
        out["crossed"] = [first.unique().tolist(), second.unique().tolist()]
    if me == 0:
        senders = []
        for _ in range(n - 1):
            t = torch.zeros(4)
            src = dist.recv(t, group=pg)  # from any source: returns the sender
            senders.append([src, t.unique().tolist()])
        out["senders"] = sorted(senders)
    else:
        dist.send(torch.full((4,), float(me)), 0, group=pg)
    if me == 1:
        dist.send(torch.full((2,), 5.0), 0, group=pg, tag=11)
        dist.send(torch.full((2,), 6.0), 0, group=pg, tag=12)
    elif me == 0:
        x, y = torch.zeros(2), torch.zeros(2)
        wy = pg.recv_anysource([y], 12)  # from any rank, but only tag 12
        wx = pg.recv_anysource([x], 11)
        wy.wait()
        wx.wait()
        out["tagged"] = [y[0].item(), x[0].item(), wy._source_rank()]
    comm.barrier()
    comm.finalize()
    return out


def body_any_source_timeout(seconds: float) -> dict:
    """A receive from any source nobody answers raises a timeout instead of hanging, and a
    tag past MPI_TAG_UB is refused before anything is posted."""
    from torchcomms_core.comm.anysource import recv_anysource

    comm = _comm()
    result: dict = {}
    if comm.get_rank() == 0:
        upper = int(comm.get_backend_impl().engine.Get_attr(__import__("mpi4py.MPI").MPI.TAG_UB))
        try:
            comm.get_backend_impl().send_tagged(torch.ones(1), 1, upper + 1, False)
        except torchcomms.CommInputError as exc:
            result["tag"] = str(exc)
        start = time.monotonic()
        try:
            recv_anysource(comm, torch.empty(1), timeout=timedelta(seconds=seconds))
        except torchcomms.CommTimeoutError as exc:
            result.update(message=str(exc), seconds=time.monotonic() - start)
    else:
        time.sleep(seconds + 0.5)
    comm.abort()
    return result


def body_lean_calls_reuse_buffers_safely() -> dict:
    """The backend's lean calls keep MPI buffer specs by address, size and dtype; every
    result stays right when tensors come and go, share memory or pass the blocking limit."""
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    offered = comm.get_backend_impl().lean_calls(comm.get_timeout(), {})
    fast = [offered.get(op) for op in ("all_reduce", "broadcast", "all_to_all_single")]
    wrong: list[str] = []

    def expect(what: str, got: torch.Tensor, want: list) -> None:
        if got.tolist() != want:
            wrong.append(f"{what}: {got.tolist()[:6]} != {want[:6]}")

    t = torch.zeros(1)
    for i in range(30):  # one tensor, new values each time
        t.fill_(float(r + i))
        comm.all_reduce(t, ReduceOp.SUM)
        expect(f"same tensor {i}", t, [float(sum(k + i for k in range(n)))])
    for i in range(60):  # fresh tensors: addresses are reused with other dtypes and sizes
        dtype = (torch.float32, torch.int32, torch.float64, torch.bfloat16)[i % 4]
        x = torch.full((1 + i % 3,), r + 1, dtype=dtype)
        comm.all_reduce(x, ReduceOp.MAX if i % 2 else ReduceOp.SUM)
        want = float(n) if i % 2 else float(n * (n + 1) // 2)
        expect(f"fresh {i} {dtype}", x.float(), [want] * (1 + i % 3))
        b = torch.full((2 + i % 2,), float(r * 10 + i), dtype=dtype)
        comm.broadcast(b, i % n)
        expect(f"bcast {i}", b.float(), [float((i % n) * 10 + i)] * (2 + i % 2))
        del x, b
    big = torch.arange(8 * n, dtype=torch.float32) + 1000 * r
    for k in range(3):  # views at several offsets of one allocation
        v = big[k * n : k * n + n]
        comm.broadcast(v, 0)
        expect(f"view {k}", v, [float(k * n + j) for j in range(n)])
    # all_to_all_single: separate, identical (in place) and partly overlapping buffers
    inp = torch.arange(2 * n, dtype=torch.float32) + 100 * r
    want = [100.0 * s + 2 * r + j for s in range(n) for j in range(2)]
    out = torch.empty(2 * n)
    comm.all_to_all_single(out, inp)
    expect("a2a", out, want)
    same = inp.clone()
    comm.all_to_all_single(same, same)
    expect("a2a in place", same, want)
    buf = torch.zeros(3 * n)
    buf[: 2 * n] = inp
    comm.all_to_all_single(buf[n:], buf[: 2 * n])  # input and output overlap in part
    expect("a2a overlapping", buf[n:], want)
    # Past the blocking limit (64 KiB) the lean calls hand over to the nonblocking methods.
    large = torch.full((20_000 * n,), float(r + 1))
    comm.all_reduce(large, ReduceOp.SUM)
    expect("large all_reduce", large[:3], [float(n * (n + 1) // 2)] * 3)
    comm.broadcast(large, n - 1)
    expect("large broadcast", large[-2:], [float(n * (n + 1) // 2)] * 2)
    la_in = torch.arange(20_000 * n, dtype=torch.float32) + r
    la_out = torch.empty_like(la_in)
    comm.all_to_all_single(la_out, la_in)
    blk = 20_000
    expect("large a2a", la_out[::blk], [float(s + r * blk) for s in range(n)])
    comm.finalize()
    return {"fast": [f is not None for f in fast], "wrong": wrong}


# -- tests -----------------------------------------------------------------------------------


def test_bfloat16_and_float16_reduce_exactly(mpi_pool) -> None:
    for checked in mpi_pool.run(body_half_precision_reductions, timeout=120):
        assert checked == ["torch.bfloat16", "torch.float16"]


def test_ranks_may_mix_sync_and_async_calls(mpi_pool) -> None:
    mpi_pool.run(body_sync_and_async_mix_across_ranks, 40, timeout=60)


def test_results_land_in_the_callers_tensors(mpi_pool) -> None:
    mpi_pool.run(body_zero_copy_layouts, timeout=60)


@pytest.mark.parametrize("numel", [5, 1 << 20])  # eager, and MPICH's rendezvous protocol
def test_tags_and_receives_from_any_source_match_as_mpi_does(mpi_pool, numel: int) -> None:
    from torchcomms_core.spec import method_support
    from torchcomms_mpi import MpiBackend

    support = method_support(MpiBackend)
    assert support["send_tagged"] == support["recv_tagged"] == "native"
    assert support["recv_anysource"] == "native"
    results = mpi_pool.run(body_tags_and_any_source, numel, timeout=120)
    n = len(results)
    assert results[1]["crossed"] == [[2.0], [1.0]]  # tag 9's message first, as posted
    assert results[0]["senders"] == [[r, [float(r)]] for r in range(1, n)]
    assert results[0]["tagged"] == [6.0, 5.0, 1]


def test_a_receive_from_any_source_times_out_instead_of_hanging(mpi_pool) -> None:
    first = mpi_pool.run(body_any_source_timeout, 1.0, timeout=60)[0]
    assert "MPI_TAG_UB" in first["tag"], first
    assert "recv did not complete within 1 s" in first["message"], first
    assert 1.0 <= first["seconds"] < 5.0, first


def test_lean_calls_reuse_buffer_specs_safely(mpi_pool) -> None:
    for res in mpi_pool.run(body_lean_calls_reuse_buffers_safely, timeout=120):
        assert res == {"fast": [True, True, True], "wrong": []}


def test_split_builds_disjoint_and_nested_groups(mpi_pool) -> None:
    results = mpi_pool.run(body_split_groups, timeout=60)
    n = mpi_pool.world_size
    assert sorted(tuple(x) for x in results) == sorted(
        (k // 2, len(range(k % 2, n, 2))) for k in range(n)
    )


def test_a_synchronous_call_times_out_instead_of_hanging(mpi_pool) -> None:
    first = mpi_pool.run(body_sync_timeout, 1.0, timeout=60)[0]
    assert "recv did not complete within 1 s" in first["message"], first
    assert 1.0 <= first["seconds"] < 5.0, first


_STUCK = textwrap.dedent("""
    import sys, time, torch, torchcomms
    from datetime import timedelta
    comm = torchcomms.new_comm("mpi", torch.device("cpu"), name="stuck",
                               timeout=timedelta(seconds=1),
                               abort_process_on_timeout_or_error=False)
    t = torch.ones(4)
    comm.all_reduce(t, torchcomms.ReduceOp.SUM)
    if comm.get_rank() == 0:
        start = time.monotonic()
        try:
            comm.all_reduce(t, torchcomms.ReduceOp.SUM)  # rank 1 never comes
            print("RETURNED", flush=True)
        except torchcomms.CommTimeoutError as exc:
            print(f"RAISED after {time.monotonic() - start:.1f} s: {exc}", flush=True)
        comm.abort()
    else:
        time.sleep(float(sys.argv[1]))
        comm.abort()
""")


def _run_stuck(tmp_path, blocking_bytes: str | None, sleep_s: float) -> tuple[object, float]:
    script = tmp_path / "stuck.py"
    script.write_text(_STUCK)
    env = _clean_env()
    if blocking_bytes is not None:
        env["TORCHCOMM_MPI_BLOCKING_BYTES"] = blocking_bytes
    start = time.monotonic()
    res = subprocess.run(
        [find_mpiexec(), "-n", "2", sys.executable, str(script), str(sleep_s)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return res, time.monotonic() - start


def test_a_small_collective_past_its_timeout_is_aborted_by_the_watchdog(tmp_path) -> None:
    # Blocking MPI cannot raise: the watchdog reports the call and aborts the job, well
    # before the peer's 60 s sleep ends.
    res, took = _run_stuck(tmp_path, None, 60.0)
    assert res.returncode != 0, res.stdout + res.stderr
    assert "RETURNED" not in res.stdout and "RAISED" not in res.stdout
    assert "torchcomms-mpi watchdog: all_reduce on communicator 'stuck'" in res.stderr
    assert "did not complete within 1 s" in res.stderr
    assert "TORCHCOMM_MPI_BLOCKING_BYTES" in res.stderr  # says how to get exceptions instead
    assert took < 40, took


def test_with_blocking_off_a_collective_timeout_raises(tmp_path) -> None:
    res, _ = _run_stuck(tmp_path, "0", 3.0)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "RAISED after" in res.stdout and "all_reduce did not complete within 1 s" in res.stdout
    assert "watchdog" not in res.stderr


@pytest.mark.parametrize("value", ["-1", "64K", "lots"])
def test_a_bad_blocking_bytes_value_is_refused_with_the_fix(monkeypatch, value: str) -> None:
    from torchcomms_mpi.backend import blocking_bytes

    monkeypatch.setenv("TORCHCOMM_MPI_BLOCKING_BYTES", value)
    with pytest.raises(torchcomms.BootstrapError, match="whole number >= 0"):
        blocking_bytes()
    monkeypatch.setenv("TORCHCOMM_MPI_BLOCKING_BYTES", "4096")
    assert blocking_bytes() == 4096
    monkeypatch.delenv("TORCHCOMM_MPI_BLOCKING_BYTES")
    assert blocking_bytes() == 65536


def test_bench_runs_under_mpiexec_and_compares_with_mpi4py() -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchcomms_core.cli",
            "bench",
            "--backend",
            "mpi",
            "--nproc",
            "2",
            "--compare",
            "mpi4py",
            "--ops",
            "all_reduce,broadcast,all_to_all_single,window_put",
            "-b",
            "8",
            "-e",
            "4K",
            "-f",
            "32",
            "-n",
            "3",
            "-w",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=_clean_env(),
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    assert "ours/mpi4py" in out and "mpi4py MPI.Comm.Allreduce on its own communicator" in out
    assert out.count("# Out of bounds values : 0 OK (mpi4py: 0 OK)") == 3
    assert "# window_put: backend mpi, 2 ranks" in out
    assert out.count("# Out of bounds values : 0 OK") == 4


def test_an_aborted_job_leaves_no_mpich_segment(tmp_path) -> None:
    """MPI_Abort ends the ranks before MPI_Finalize, which is where MPICH removes its
    shared-memory segment: the watchdog removes the segments its rank mapped first."""
    from torchcomms_mpi.watchdog import unlink_job_segments

    before = {n for n in os.listdir("/dev/shm") if n.startswith("mpich_shm_")}
    res, _ = _run_stuck(tmp_path, None, 60.0)
    assert res.returncode != 0 and "watchdog" in res.stderr
    after = {n for n in os.listdir("/dev/shm") if n.startswith("mpich_shm_")}
    assert after <= before, sorted(after - before)
    # Only MPICH segments mapped by this process go: a listing of other mappings is left.
    maps = tmp_path / "maps"
    kept = tmp_path / "mpich_shm_kept"
    kept.write_bytes(b"x")
    maps.write_text(
        f"7f00-7f01 rw-s 00000000 00:1a 1 {kept}\n"
        "7f01-7f02 rw-s 00000000 00:1a 2 /dev/shm/torchcomms-1-abc\n"
        "7f02-7f03 rw-s 00000000 00:1a 3 /dev/shm/mpich_shm_gone (deleted)\n"
    )
    assert unlink_job_segments(str(maps)) == []
    assert kept.exists()
    mine = f"/dev/shm/mpich_shm_test{os.getpid()}_0"
    with open(mine, "wb") as f:
        f.write(b"x")
    try:
        maps.write_text(f"7f00-7f01 rw-s 00000000 00:1a 1 {mine}\n" * 2)
        assert unlink_job_segments(str(maps)) == [mine]
        assert not os.path.exists(mine)
    finally:
        if os.path.exists(mine):
            os.unlink(mine)

"""The shm backend on real rank processes: large and uneven messages through a small arena,
point-to-point through the rings, windows, faults (SIGKILL, abort), leaks, bad input and
the host check. The conformance suite runs in ``tests/plugins/test_conformance_runs.py``."""

from __future__ import annotations

import glob
import os
import signal
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch

import torchcomms
from torchcomms import ReduceOp
from torchcomms_core.testing import RankPool, current_rank, unique_name

TIMEOUT_S = 60.0  # the communicators' timeout; faults must be reported well before it
BOUND_S = 10.0  # "well before the timeout": a correctness bound, not a speed goal


def _comm(prefix: str, **hints: str) -> torchcomms.TorchComm:
    return torchcomms.new_comm(
        "shm",
        torch.device("cpu"),
        name=unique_name(prefix),
        timeout=timedelta(seconds=TIMEOUT_S),
        abort_process_on_timeout_or_error=False,
        hints=hints,
    )


def _segments(pids: list[int]) -> list[str]:
    """Files in /dev/shm created by these processes (names carry the creator's pid)."""
    return [p for pid in pids for p in glob.glob(f"/dev/shm/torchcomms-shm-{pid}-*")]


def _vals(rank: int, count: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Exact small integers (sums stay exact in float32), different per rank and index."""
    return ((torch.arange(count, dtype=torch.int64) * 7 + rank * 3) % 251).to(dtype)


# -- large and uneven messages -----------------------------------------------------------


def body_large(arena: int, big: int, odd: int) -> dict:
    """Every native collective on ``odd`` elements (not a multiple of the arena's chunk),
    and an all-reduce of ``big`` elements, checked exactly against local references."""
    comm = _comm("large", arena_bytes=str(arena))
    r, n = comm.get_rank(), comm.get_size()
    out: dict = {"segment": comm.get_backend_impl()._segname, "pid": os.getpid()}

    t = _vals(r, big)
    comm.all_reduce(t, ReduceOp.SUM)
    assert torch.equal(t, sum(_vals(k, big) for k in range(n))), "all_reduce big"

    t = _vals(r, odd)
    comm.all_reduce(t, ReduceOp.MAX, async_op=True).wait()
    assert torch.equal(t, torch.stack([_vals(k, odd) for k in range(n)]).amax(0)), "max"

    t = _vals(r, odd, torch.int64) + r
    comm.broadcast(t, n - 1)
    assert torch.equal(t, _vals(n - 1, odd, torch.int64) + n - 1), "broadcast"

    # Uneven all-gather: rank k contributes odd + 1000 * k elements.
    mine = _vals(r, odd + 1000 * r)
    outs = [torch.empty(odd + 1000 * k) for k in range(n)]
    comm.all_gather_v(outs, mine)
    for k in range(n):
        assert torch.equal(outs[k], _vals(k, odd + 1000 * k)), f"all_gather_v[{k}]"
    flat = torch.empty(n * odd)
    comm.all_gather_single(flat, _vals(r, odd))
    assert torch.equal(flat, torch.cat([_vals(k, odd) for k in range(n)])), "all_gather_single"

    # Uneven reduce-scatter: rank k receives odd + 3 * k elements.
    ins = [_vals(r + j, odd + 3 * j) for j in range(n)]
    res = torch.empty(odd + 3 * r)
    comm.reduce_scatter_v(res, ins, ReduceOp.SUM)
    assert torch.equal(res, sum(_vals(k + r, odd + 3 * r) for k in range(n))), "rs_v"
    res = torch.empty(odd)
    comm.reduce_scatter_single(res, torch.cat([_vals(r + j, odd) for j in range(n)]), ReduceOp.MIN)
    want = torch.stack([_vals(k + r, odd) for k in range(n)]).amin(0)
    assert torch.equal(res, want), "reduce_scatter_single"

    # Uneven all-to-all: rank s sends odd + s + 2 * d rows of 3 to rank d.
    rows = [odd // 3 + r + 2 * d for d in range(n)]
    src = torch.cat([_vals(100 * r + d, k * 3).view(k, 3) for d, k in enumerate(rows)])
    got_rows = [odd // 3 + s + 2 * r for s in range(n)]
    dst = torch.empty(sum(got_rows), 3)
    comm.all_to_all_v_single(dst, src, got_rows, rows)
    want = torch.cat([_vals(100 * s + r, k * 3).view(k, 3) for s, k in enumerate(got_rows)])
    assert torch.equal(dst, want), "all_to_all_v_single"
    # In place (output is input).
    inplace = torch.cat([_vals(10 * r + d, odd) for d in range(n)])
    comm.all_to_all_single(inplace, inplace)
    assert torch.equal(inplace, torch.cat([_vals(10 * s + r, odd) for s in range(n)])), "a2a"
    comm.finalize()
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_large_and_uneven_messages_through_a_small_arena(world_size: int) -> None:
    # A 64 KiB arena (32 KiB chunks): 4 MiB of float32 is 128 chunks, 100003 elements
    # a chunk count with a remainder on every operation.
    with RankPool(world_size) as pool:
        results = pool.run(body_large, 65536, 1 << 20, 100003, timeout=300)
        assert not _segments([res["pid"] for res in results])
        assert all(not os.path.exists(f"/dev/shm/{res['segment']}") for res in results)


def body_64mib() -> bool:
    """A 64 MiB all-reduce (plus an uneven tail) and a 64 MiB all-gather, default arena."""
    comm = _comm("64mib")
    r, n = comm.get_rank(), comm.get_size()
    count = (64 << 20) // 4 + 5
    base = torch.arange(count, dtype=torch.int32).bitwise_and_(1023).float()
    t = base + r
    comm.all_reduce(t, ReduceOp.SUM)
    assert torch.equal(t, base * n + n * (n - 1) // 2), "all_reduce 64 MiB"
    part = count // n
    gathered = torch.empty(part * n)
    comm.all_gather_single(gathered, base[:part] + r)
    want = torch.cat([base[:part] + k for k in range(n)])
    assert torch.equal(gathered, want), "all_gather 64 MiB"
    comm.finalize()
    return True


def test_64_mib(pool: RankPool) -> None:
    assert pool.run(body_64mib, timeout=300) == [True] * pool.world_size


def _ptrace_allowed() -> bool:
    """Whether sibling processes of this user may read each other's memory here."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read())
    except OSError:
        scope = 0
    return scope == 0 or (scope == 1 and os.geteuid() == 0)


def body_direct_vs_staged() -> dict:
    """Large all-to-alls through cross-memory reads (blocks of at least ``cma_bytes``) and
    through the arena (``cma_bytes=0``) give the same bytes, and the other collectives
    and uneven forms (which always stage) on a communicator with reads on still do."""
    direct = _comm("direct", cma_bytes=str(1 << 20))
    staged = _comm("staged", cma_bytes="0")
    r, n = direct.get_rank(), direct.get_size()
    out: dict = {"cma": direct.get_backend_impl()._cma, "off": staged.get_backend_impl()._cma}
    block = (3 << 20) // 4 + 17  # 3 MiB and an odd tail, in float32
    results = []
    for comm in (direct, staged):
        got = {}
        flat = torch.empty(n * block)
        comm.all_gather_single(flat, _vals(r, block))
        got["all_gather_single"] = flat
        outs = [torch.full((block + k,), -1.0) for k in range(n)]
        comm.all_gather_v(outs, _vals(r, block + r))
        got["all_gather_v"] = torch.cat(outs)
        a2a_in = torch.cat([_vals(r * n + k, block) for k in range(n)])
        a2a_out = torch.empty_like(a2a_in)
        comm.all_to_all_single(a2a_out, a2a_in)
        got["all_to_all_single"] = a2a_out.clone()
        # In place (a2a_out doubles as input): all-to-all twice gives each rank its own
        # blocks back.
        comm.all_to_all_single(a2a_out, a2a_out, async_op=True).wait()
        got["all_to_all_single in place"] = a2a_out.clone()
        sizes = [block + k + r for k in range(n)]  # rank r sends block + k + r to rank k
        v_in = torch.cat([_vals(r + k, sizes[k]) for k in range(n)])
        v_out = torch.empty(sum(block + r + k for k in range(n)))
        comm.all_to_all_v_single(v_out, v_in, [block + r + k for k in range(n)], sizes)
        got["all_to_all_v_single"] = v_out
        b = _vals(r, 2 * block) + r
        comm.broadcast(b, n - 1)
        got["broadcast"] = b
        results.append(got)
    want = {
        "all_gather_single": torch.cat([_vals(k, block) for k in range(n)]),
        "all_gather_v": torch.cat([_vals(k, block + k) for k in range(n)]),
        "all_to_all_single": torch.cat([_vals(k * n + r, block) for k in range(n)]),
        "all_to_all_v_single": torch.cat([_vals(k + r, block + r + k) for k in range(n)]),
        "broadcast": _vals(n - 1, 2 * block) + n - 1,
    }
    want["all_to_all_single in place"] = torch.cat([_vals(r * n + k, block) for k in range(n)])
    for name, value in want.items():
        for label, got in zip(("direct", "staged"), results, strict=True):
            assert torch.equal(got[name], value), f"{name} ({label})"
    direct.finalize()
    staged.finalize()
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_direct_reads_and_staging_agree(world_size: int) -> None:
    with RankPool(world_size) as pool:
        results = pool.run(body_direct_vs_staged, timeout=300)
    assert all(res["off"] == 0 for res in results)
    if _ptrace_allowed():  # where peers may read each other, the probe must find it
        assert all(res["cma"] == 1 << 20 for res in results), results
    else:
        pytest.skip("ptrace_scope forbids reads between sibling processes: staging only")


def body_direct_size_mismatch() -> dict:
    """Rank 1 passes larger blocks to an all-to-all than the others: every rank gets a
    clear error instead of wrong data, and the communicator still works afterwards."""
    comm = _comm("mismatch", cma_bytes=str(1 << 16))
    r, n = comm.get_rank(), comm.get_size()
    block = (1 << 20) + (1 if r == 1 else 0)
    out: dict = {}
    try:
        comm.all_to_all_single(torch.empty(n * block), torch.ones(n * block))
        out["gather"] = "completed"
    except torchcomms.TorchCommError as exc:
        out["gather"] = str(exc)
    t = torch.ones(4)
    comm.all_reduce(t, ReduceOp.SUM)
    out["after"] = t.tolist()
    comm.finalize()
    return out


def test_direct_read_of_a_mismatched_size_fails_clearly(pool: RankPool) -> None:
    results = pool.run(body_direct_size_mismatch, timeout=120)
    n = pool.world_size
    for r, res in enumerate(results):
        assert res["after"] == [float(n)] * 4, res
        if not _ptrace_allowed():
            continue
        if r == 1:
            assert "sent 4194304 bytes where this rank expects 4194308" in res["gather"], res
        else:
            assert "rank 1 sent 4194308 bytes where this rank expects 4194304" in res["gather"]


def body_sleepers() -> dict:
    """Rank 0 arrives a second late; the others must sleep meanwhile (little CPU) and be
    woken to finish with the right result."""
    comm = _comm("sleep", spin_us="0", yield_us="0")
    r, n = comm.get_rank(), comm.get_size()
    comm.barrier()
    if r == 0:
        time.sleep(1.0)
    cpu0, t0 = time.process_time(), time.monotonic()
    t = torch.full((8,), float(r))
    comm.all_reduce(t, ReduceOp.SUM)
    out = {"cpu": time.process_time() - cpu0, "wall": time.monotonic() - t0}
    assert t.tolist() == [float(n * (n - 1) // 2)] * 8
    # Many short waits in a row: sleeping and waking must not lose a wake-up.
    for i in range(200):
        t = torch.full((2,), float(i))
        comm.all_reduce(t, ReduceOp.MAX)
        assert t.tolist() == [float(i)] * 2
    comm.finalize()
    return out


def test_waiting_ranks_sleep_until_woken(pool: RankPool) -> None:
    results = pool.run(body_sleepers, timeout=120)
    for res in results[1:]:
        assert res["wall"] > 0.5, res  # it did wait for rank 0
        assert res["cpu"] < 0.25, res  # ... asleep: polling would burn most of that second


# -- point to point ----------------------------------------------------------------------


def body_p2p(count: int) -> list[str]:
    """Every rank sends ``count`` floats to its right while receiving from its left, through
    rings far smaller than the message; then a receive of the wrong size is refused."""
    side = _comm("p2p-side")  # holds the ranks until the refusal was seen
    comm = _comm("p2p", p2p_bytes="65536")
    r, n = comm.get_rank(), comm.get_size()
    right, left = (r + 1) % n, (r - 1) % n
    got = torch.empty(count)
    work = comm.send(_vals(r, count), right, async_op=True)  # must not block on the peer
    comm.recv(got, left)
    work.wait()
    assert torch.equal(got, _vals(left, count)), "ring"
    # Both directions at once in one batch, receives listed first.
    a, b = torch.empty(count), torch.empty(count)
    batch = comm.batch_op_create()
    batch.recv(a, left).recv(b, right).send(_vals(r, count), right).send(_vals(r, count), left)
    batch.issue(async_op=False)
    assert torch.equal(a, _vals(left, count)) and torch.equal(b, _vals(right, count)), "batch"
    errors = []
    if r == 0:
        comm.send(torch.ones(5), 1)
    elif r == 1:
        try:
            comm.recv(torch.empty(4), 0)
        except torchcomms.TorchCommError as exc:
            errors.append(str(exc))
    side.barrier()
    comm.abort()
    side.finalize()
    return errors


def test_point_to_point_larger_than_the_rings(pool: RankPool) -> None:
    # 4 MiB and 12 bytes through 64 KiB rings: 64 refills each way, a padded tail.
    results = pool.run(body_p2p, (1 << 20) + 3, timeout=300)
    assert "expects 16 bytes but rank 0 sent 20" in results[1][0]


def body_tags_and_any_source(big: int) -> dict:
    """Tags and receives from any source through 64 KiB rings: messages that block a posted
    receive are read out of the way (``big`` float32, past the ring), receives posted while
    such a message is read still take it, every sender of an any-source receive is named."""
    from torchcomms_core.comm import anysource, tagged

    comm = _comm("tags", p2p_bytes=str(64 << 10))
    r, n = comm.get_rank(), comm.get_size()
    out: dict = {}
    if r == 0:
        works = [
            tagged.send(comm, _vals(7, 8 * big), 1, 7, True),  # read aside on rank 1
            tagged.send(comm, _vals(8, 5), 1, 8, True),
            tagged.send(comm, _vals(9, 5), 1, 9, True),
            comm.send(_vals(0, big), 1, True),  # tag 0, behind them
        ]
        for w in works:
            w.wait()
    elif r == 1:
        nine, eight = torch.zeros(5), torch.zeros(5)
        w9 = tagged.recv(comm, nine, 0, 9, True)  # posted first: the tag 7 and 8 ones block it
        p2p = comm.get_backend_impl()._p2p  # its channel state, to time the next receive
        deadline = time.monotonic() + BOUND_S
        while p2p._incoming[0] is None and time.monotonic() < deadline:
            w9.is_completed()  # advances the channel: tag 7's message starts being read aside
        out["read_aside"] = p2p._incoming[0] is not None and p2p._incoming[0].tag == 7
        seven = torch.zeros(8 * big)
        w7 = tagged.recv(comm, seven, 0, 7, True)  # so this one takes it once it is read
        w9.wait()
        tagged.recv(comm, eight, 0, 8)
        w7.wait()
        plain = torch.zeros(big)
        comm.recv(plain, 0)
        out["tags"] = [
            torch.equal(nine, _vals(9, 5)),
            torch.equal(eight, _vals(8, 5)),
            torch.equal(seven, _vals(7, 8 * big)),
            torch.equal(plain, _vals(0, big)),
        ]
    comm.barrier()
    if r == 0:
        got = {}
        for _ in range(n - 1):
            t = torch.zeros(big)
            work, source = anysource.recv_anysource(comm, t, True)
            work.wait()
            got[source()] = torch.equal(t, _vals(source(), big))
        late = torch.zeros(3)
        work, source = anysource.recv_anysource(comm, late, True, tag=12)
        early = torch.zeros(3)
        tagged.recv(comm, early, n - 1, 11)
        work.wait()
        out["any"] = got
        out["tagged_any"] = [source(), late.tolist(), early.tolist()]
    else:
        comm.send(_vals(r, big), 0)
        if r == n - 1:
            tagged.send(comm, torch.full((3,), 11.0), 0, 11)
            tagged.send(comm, torch.full((3,), 12.0), 0, 12)
    comm.barrier()
    if r == 0:  # an unexpected message of another size: refused with both sizes
        tagged.send(comm, torch.ones(4), 1, 3)
        tagged.send(comm, torch.ones(2), 1, 4)
    elif r == 1:
        try:
            tagged.recv(comm, torch.zeros(2), 0, 4)
            tagged.recv(comm, torch.zeros(5), 0, 3)
        except torchcomms.CommInputError as exc:
            out["mismatch"] = str(exc)
    comm.abort()
    return out


def test_tags_and_receives_from_any_source(pool: RankPool) -> None:
    from torchcomms_core.spec import method_support
    from torchcomms_shm import ShmBackend

    support = method_support(ShmBackend)
    assert support["send_tagged"] == support["recv_tagged"] == support["recv_anysource"]
    assert support["recv_anysource"] == "native"
    big = (300 << 10) // 4 + 3  # past the 64 KiB ring, an odd tail
    results = pool.run(body_tags_and_any_source, big, timeout=300)
    n = len(results)
    assert results[1]["tags"] == [True, True, True, True]
    assert results[1]["read_aside"] is True  # the receive of tag 7 came while it was read
    assert results[0]["any"] == {k: True for k in range(1, n)}
    assert results[0]["tagged_any"] == [n - 1, [12.0] * 3, [11.0] * 3]
    assert "expects 20 bytes but rank 0 sent 16" in results[1]["mismatch"]


def body_any_source_timeout() -> dict:
    from torchcomms_core.comm.anysource import recv_anysource

    comm = _comm("anytimeout")
    out: dict = {}
    if comm.get_rank() == 0:
        start = time.monotonic()
        try:
            recv_anysource(comm, torch.zeros(2), timeout=timedelta(seconds=1))
        except torchcomms.CommTimeoutError as exc:
            out = {"message": str(exc), "seconds": time.monotonic() - start}
    else:
        time.sleep(1.5)
    comm.abort()
    return out


def test_a_receive_from_any_source_nobody_answers_times_out(pool2: RankPool) -> None:
    first = pool2.run(body_any_source_timeout, timeout=60)[0]
    assert "timed out after 1 s" in first["message"], first
    assert 1.0 <= first["seconds"] < BOUND_S, first


# -- windows -----------------------------------------------------------------------------


def body_window() -> list[float]:
    comm = _comm("win")
    r, n = comm.get_rank(), comm.get_size()
    win = comm.new_window()
    buf = torch.zeros(4 * n)
    win.tensor_register(buf)
    right = (r + 1) % n
    win.put(torch.full((4,), float(r + 1)), right, 4 * r, False)
    win.signal(right, False)
    win.wait_signal((r - 1) % n, False)
    seen = buf.tolist()
    win.tensor_deregister()
    comm.finalize()
    return seen


def test_windows_put_and_signal(pool: RankPool) -> None:
    n = pool.world_size
    for r, seen in enumerate(pool.run(body_window, timeout=60)):
        left = (r - 1) % n
        want = [0.0] * (4 * n)
        want[4 * left : 4 * left + 4] = [float(left + 1)] * 4
        assert seen == want


# -- faults ------------------------------------------------------------------------------


def body_killed(victim: int, op: str = "all_reduce") -> dict:
    """``victim`` SIGKILLs itself while the others are inside an all-reduce (or a large
    all-to-all, which reads peers' memory directly); they must fail long before the
    timeout, and later calls must fail too."""
    extra = {"algorithm.all_reduce": "direct"} if op == "direct" else {}
    comm = _comm("kill", cma_bytes=str(1 << 16), **extra)  # large all-to-alls read directly
    r = comm.get_rank()
    out: dict = {"pid": os.getpid(), "segment": comm.get_backend_impl()._segname}
    comm.barrier()
    if r == victim:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        if op == "all_to_all":
            n = comm.get_size()
            comm.all_to_all_single(torch.empty(n << 20), torch.ones(n << 20))
        elif op == "small":  # the memoryview path (8 bytes)
            comm.all_reduce(torch.ones(2), ReduceOp.SUM)
        else:  # 4 MiB: chunked, measured, or cross-memory reads ("direct")
            comm.all_reduce(torch.ones(1 << 20), ReduceOp.SUM)
        out["pending"] = "completed"
    except torchcomms.TorchCommError as exc:
        out["pending"] = str(exc)
    out["seconds"] = time.monotonic() - t0
    try:
        comm.barrier()
        out["later"] = "completed"
    except torchcomms.TorchCommError as exc:
        out["later"] = type(exc).__name__
    out["later_seconds"] = time.monotonic() - t0
    comm.abort()
    return out


@pytest.mark.parametrize(
    ("world_size", "victim", "op"),
    [
        (2, 1, "all_reduce"),
        (4, 0, "all_reduce"),
        (4, 2, "all_to_all"),
        (2, 1, "small"),
        (4, 3, "small"),
        (4, 1, "direct"),
    ],
)
def test_sigkill_during_a_collective_fails_the_survivors(
    world_size: int, victim: int, op: str
) -> None:
    with RankPool(world_size, grace_s=BOUND_S) as pool:
        outcomes = pool.run_outcomes(body_killed, victim, op, timeout=120)
    assert outcomes[victim].status == "died"
    survivors = [o for o in outcomes if o.rank != victim]
    for o in survivors:
        assert o.ok, o.error
        res = o.value
        assert f"rank(s) [{victim}] exited" in res["pending"], res
        assert res["later"] != "completed" and res["later_seconds"] < BOUND_S, res
        assert not os.path.exists(f"/dev/shm/{res['segment']}")
    assert not _segments([o.value["pid"] for o in survivors])


def body_abort(from_thread: bool) -> dict:
    """Rank 0 waits in an all-reduce nobody joins; abort() must end the wait at once."""
    side = torchcomms.new_comm("shm", torch.device("cpu"), name=unique_name("side"))
    comm = _comm("abort")
    out: dict = {}
    if comm.get_rank() == 0:
        t0 = time.monotonic()
        if from_thread:  # a synchronous call blocked in another thread
            box: dict = {}

            def run() -> None:
                try:
                    comm.all_reduce(torch.ones(8), ReduceOp.SUM)
                    box["r"] = "completed"
                except torchcomms.TorchCommError as exc:
                    box["r"] = str(exc)

            th = threading.Thread(target=run)
            th.start()
            time.sleep(0.5)
            comm.abort()
            th.join(BOUND_S)
            out["wait"] = box.get("r", "still blocked")
        else:  # an asynchronous call, waited on after the abort
            work = comm.all_reduce(torch.ones(8), ReduceOp.SUM, async_op=True)
            time.sleep(0.5)
            comm.abort()
            try:
                work.wait()
                out["wait"] = "completed"
            except torchcomms.TorchCommError as exc:
                out["wait"] = str(exc)
        out["seconds"] = time.monotonic() - t0
    side.barrier()  # peers stay alive (and out of ``comm``) until rank 0 is done
    if comm.get_rank() != 0:
        comm.abort()
    side.finalize()
    return out


@pytest.mark.parametrize("from_thread", [False, True])
def test_abort_unblocks_a_waiting_collective(pool2: RankPool, from_thread: bool) -> None:
    res = pool2.run(body_abort, from_thread, timeout=120)[0]
    assert "abort" in res["wait"], res
    assert res["seconds"] < BOUND_S, res


def body_peer_abort() -> str:
    """A peer's abort fails the ranks waiting for it without waiting for the timeout."""
    comm = _comm("peer-abort")
    if comm.get_rank() == 1:
        time.sleep(0.3)
        comm.abort()
        return "aborted"
    t0 = time.monotonic()
    try:
        comm.barrier()
        return "completed"
    except torchcomms.TorchCommError as exc:
        assert time.monotonic() - t0 < BOUND_S
        return str(exc)
    finally:
        comm.abort()


def test_a_peer_abort_fails_the_waiters(pool2: RankPool) -> None:
    res = pool2.run(body_peer_abort, timeout=60)
    assert "rank(s) [1] aborted the communicator" in res[0]


# -- lifecycle, input, host check --------------------------------------------------------


def body_reconfigure() -> tuple[int, int, float]:
    from torch._C._distributed_c10d import TCPStore

    n = int(os.environ["TORCHCOMM_SIZE"])
    r = current_rank()
    name = unique_name("reconf")
    comm = torchcomms.new_comm(
        "shm",
        torch.device("cpu"),
        name=name,
        enable_reconfigure=True,
        timeout=timedelta(seconds=60),
    )
    store = TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        None,
        False,
        timedelta(seconds=30),
    )
    store.set(f"{name}/{r}", comm.get_init_handle())
    handles = [store.get(f"{name}/{k}").decode() for k in range(n)]
    comm.reconfigure(1, list(reversed(handles)))
    t = torch.ones(1 << 16)
    comm.all_reduce(t, ReduceOp.SUM)
    out = (comm.get_rank(), comm.get_size(), float(t[0]))
    comm.finalize()
    return out


def test_reconfigure_on_one_host(pool: RankPool) -> None:
    n = pool.world_size
    results = pool.run(body_reconfigure, timeout=120)
    assert results == [(n - 1 - r, n, float(n)) for r in range(n)]


def body_hosts() -> str:
    try:
        torchcomms.new_comm(
            "shm", "cpu", name=unique_name("hosts"), hints={"host_id": f"node{current_rank() % 2}"}
        )
    except torchcomms.CommInputError as exc:
        return str(exc)
    return "created"


def test_ranks_on_two_hosts_are_refused(pool: RankPool) -> None:
    for msg in pool.run(body_hosts, timeout=60):
        assert "needs every rank on one host" in msg and "2 hosts" in msg
        assert "node0: ranks [0" in msg and "node1: ranks [1" in msg
        assert "'gloo'" in msg and "'hier'" in msg


def body_bad_hint() -> str:
    try:
        torchcomms.new_comm("shm", "cpu", name=unique_name("hint"), hints={"arena_bytes": "lots"})
    except torchcomms.CommInputError as exc:
        return str(exc)
    return "created"


def test_bad_hint(pool2: RankPool) -> None:
    assert all("arena_bytes" in m and "not an integer" in m for m in pool2.run(body_bad_hint))


def body_arena_defaults(explicit_on_rank0: bool) -> dict[str, Any]:
    """Each rank's own default arena differs (as where ranks see different free space in
    /dev/shm): the ranks take the smallest; a hint on one rank only must match the others."""
    import torchcomms_shm.comm as shm_comm

    rank = current_rank()
    own = shm_comm.default_arena
    shm_comm.default_arena = lambda size, p2p, shared=None: (rank + 1) << 20  # type: ignore[assignment]
    hints = {"arena_bytes": str(3 << 20)} if explicit_on_rank0 and rank == 0 else {}
    try:
        comm = _comm("arena", **hints)
    except torchcomms.CommInputError as exc:
        return {"error": str(exc)}
    finally:
        shm_comm.default_arena = own  # type: ignore[assignment]
    layout = comm.get_backend_impl()._lockstep.layout
    n = comm.get_size()
    t = torch.arange(300_000, dtype=torch.float32) + rank  # several chunks of 512 KiB
    comm.all_reduce(t, torchcomms.ReduceOp.SUM)
    expected = torch.arange(300_000, dtype=torch.float32) * n + n * (n - 1) // 2
    comm.finalize()
    return {"arena": layout.arena_bytes, "exact": bool(torch.equal(t, expected))}


def test_ranks_whose_default_arenas_differ_take_the_smallest(pool4: RankPool) -> None:
    for res in pool4.run(body_arena_defaults, False, timeout=120):
        assert res == {"arena": 1 << 20, "exact": True}


def test_a_hint_on_one_rank_must_match_the_others_defaults(pool4: RankPool) -> None:
    for res in pool4.run(body_arena_defaults, True, timeout=120):
        assert "arena_bytes" in res["error"] and "same values on every rank" in res["error"]


def test_the_default_arena_grows_with_more_ranks_than_cores_within_dev_shm() -> None:
    from torchcomms_core.plugin import usable_cores
    from torchcomms_shm.comm import DEFAULT_ARENA_BYTES, OVERSUBSCRIBED_ARENA_BYTES, default_arena

    cores = usable_cores()
    assert default_arena(cores, 256 << 10) == DEFAULT_ARENA_BYTES
    free = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
    big = default_arena(cores + 1, 256 << 10)
    assert DEFAULT_ARENA_BYTES <= big <= OVERSUBSCRIBED_ARENA_BYTES
    segment = (cores + 1) * big + (cores + 1) ** 2 * (256 << 10)
    assert big == DEFAULT_ARENA_BYTES or segment <= free // 4


def body_all_reduce_paths() -> dict[str, Any]:
    """Large all-reduces through cross-memory reads (``direct``), through the arena
    (``chunked``) and by timing (``measured``, the default) give the same bits: every
    path folds each element in rank order. A size mismatch fails clearly on every rank."""
    r = current_rank()
    paths = {
        name: _comm(f"ar-{name}", **{"algorithm.all_reduce": name})
        for name in ("direct", "chunked")
    }
    paths["measured"] = _comm("ar-measured")
    n = paths["direct"].get_size()
    if not paths["direct"].get_backend_impl()._cma_ok:
        return {"skip": "cross-memory reads not permitted here"}
    bad: list[str] = []
    gen = torch.Generator().manual_seed(7 + r)
    for count in ((1 << 18) + 3, (3 << 20) // 4 + 17, 5 << 20):
        for dtype, op in (
            (torch.float32, ReduceOp.SUM),
            (torch.float32, ReduceOp.MAX),
            (torch.float64, ReduceOp.PRODUCT),
            (torch.int64, ReduceOp.SUM),
            (torch.bfloat16, ReduceOp.SUM),
        ):
            if dtype.is_floating_point:
                x = (torch.randn(count, generator=gen, dtype=torch.float64) * 1e3).to(dtype)
            else:
                x = torch.randint(-(1 << 40), 1 << 40, (count,), generator=gen, dtype=dtype)
            got = {}
            for name, comm in paths.items():
                for _ in range(3 if name == "measured" else 1):  # both timed paths run
                    t = x.clone()
                    comm.all_reduce(t, op)
                got[name] = (
                    t.view(torch.uint8) if t.dtype != torch.bfloat16 else t.view(torch.int16)
                )
            for name in ("direct", "measured"):
                if not torch.equal(got[name], got["chunked"]):
                    bad.append(f"{name} {dtype} {op} {count}")
    out: dict[str, Any] = {"bad": bad}
    # Rank 1 passes one element more: every rank raises, and the communicator works on.
    direct = paths["direct"]
    try:
        direct.all_reduce(torch.ones((1 << 20) + (r == 1)), ReduceOp.SUM)
        out["mismatch"] = "completed"
    except torchcomms.CommInputError as exc:
        out["mismatch"] = str(exc)
    t = torch.ones(1 << 20)
    direct.all_reduce(t, ReduceOp.SUM)
    out["after"] = bool(torch.all(t == n))
    for comm in paths.values():
        comm.finalize()
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_direct_chunked_and_measured_all_reduce_agree_bit_for_bit(world_size: int) -> None:
    with RankPool(world_size) as pool:
        results = pool.run(body_all_reduce_paths, timeout=600)
    for res in results:
        if "skip" in res:
            pytest.skip(res["skip"])
        assert res["bad"] == [], res["bad"]
        assert res["after"] is True
        assert "every rank must pass the same size" in res["mismatch"], res


def test_ranks_share_cores_follows_the_launcher_the_hint_and_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``auto`` counts the launcher's ranks on this machine (a communicator of 2 among 8
    local ranks shares cores on a 2-core machine); ``spin``/``yield`` decide; a wrong value
    names the hint or the variable."""
    from torchcomms_core.plugin import LOCAL_SIZE_VARIABLES, CommInputError, usable_cores
    from torchcomms_shm.comm import WAIT_VARIABLE, default_wait, ranks_share_cores

    for name in (*LOCAL_SIZE_VARIABLES, WAIT_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    cores = usable_cores()
    assert ranks_share_cores(cores, {}) is False
    assert ranks_share_cores(cores + 1, {}) is True
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores + 1))
    assert ranks_share_cores(2, {}) is True  # a small communicator among many local ranks
    assert default_wait(2, ranks_share_cores(2, {})) == (0, 1000)
    assert ranks_share_cores(2, {"wait": "spin"}) is False  # the hint wins
    monkeypatch.setenv(WAIT_VARIABLE, "spin")
    assert ranks_share_cores(2, {}) is False
    assert ranks_share_cores(cores + 5, {"wait": "yield"}) is True
    with pytest.raises(CommInputError, match="hint wait='fast'"):
        ranks_share_cores(2, {"wait": "fast"})
    monkeypatch.setenv(WAIT_VARIABLE, "sleepy")
    with pytest.raises(CommInputError, match="TORCHCOMM_SHM_WAIT='sleepy'"):
        ranks_share_cores(2, {})


def body_wait_choice(local: str) -> dict[str, Any]:
    os.environ["LOCAL_WORLD_SIZE"] = local
    try:
        comm = _comm("wait")
        impl = comm.get_backend_impl()
        t = torch.ones(1000)
        comm.all_reduce(t, ReduceOp.SUM)
        out = {
            "shared": impl._shared_cores,
            "polls": impl._lockstep.fast_polls,
            "spin_s": impl._lockstep.waiter.spin_s,
            "ok": bool((t == comm.get_size()).all()),
        }
        comm.finalize()
        return out
    finally:
        os.environ.pop("LOCAL_WORLD_SIZE", None)


def test_a_communicator_among_more_local_ranks_than_cores_waits_by_yielding(
    pool2: RankPool,
) -> None:
    from torchcomms_core.plugin import usable_cores

    many = str(usable_cores() + 2)
    for res in pool2.run(body_wait_choice, many, timeout=120):
        assert res == {"shared": True, "polls": 1, "spin_s": 0.0, "ok": True}
    if usable_cores() >= 2:
        for res in pool2.run(body_wait_choice, "2", timeout=120):
            assert res["shared"] is False and res["polls"] == 200 and res["ok"]

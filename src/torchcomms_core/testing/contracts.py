"""The API contracts every backend must meet, as bodies run on N rank processes.

The conformance suite (``test_conformance.py``) and the project's own tests run them;
each body checks its results on every rank and raises on the first difference.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.comm.create import new_comm
from torchcomms_core.foundation.errors import (
    CommInputError,
    CommStateError,
    CommTimeoutError,
    CommTypeError,
)
from torchcomms_core.foundation.work import WorkStatus
from torchcomms_core.operations.reduce_op import ReduceOp
from torchcomms_core.testing.pool import unique_name
from torchcomms_core.testing.reference import (
    DTYPES,
    check,
    ops_for,
    product_values,
    reference,
    values,
)

#: Bytes of one message in the large contracts. Linux caps a TCP socket's buffers at 4 MiB
#: (send) and 6 MiB (receive) by default and tuned hosts rarely exceed 16 MiB, so a backend
#: that only works while the kernel buffers a whole message (a blocking ``send``) is caught.
LARGE_MESSAGE_BYTES = 16 << 20
#: Elements added to every large message so no size is a multiple of a rank count, a
#: block or a page: uneven sizes.
UNEVEN_EXTRA = 3

#: The rules the contracts check, by contract, as failure messages quote them.
RULES: dict[str, str] = {
    "send_before_recv": (
        "send(async_op=True) must return before the peer has posted its receive, and its "
        "work must complete once the peer receives (writing-a-backend.md: send 'must not "
        "block on the peer')"
    ),
    "large_p2p": (
        "send and recv must work on messages larger than the kernel's socket buffers "
        f"({LARGE_MESSAGE_BYTES >> 20} MiB and uneven sizes): a ring of async sends then "
        "receives must not deadlock"
    ),
    "large_collectives": (
        "every collective must work on messages larger than the kernel's socket buffers "
        f"({LARGE_MESSAGE_BYTES >> 20} MiB per peer, uneven sizes) with exact results: no "
        "rank may wait on a peer that is itself blocked sending"
    ),
    "api_shapes": "every operation returns a work that completes, with outputs of the "
    "promised shape, dtype and device",
    "every_op": "every operation gives the exact reference result on every declared dtype",
    "edge_counts": "every operation works on 0, 1 and 1000 elements",
    "split": "split gives working sub-communicators, and [] skips a rank",
    "batch": "a batch issues all its sends and receives before waiting on any",
    "recv_timeout": (
        "a receive nobody answers must raise CommTimeoutError within its own timeout, "
        "mark its work TIMEDOUT and refuse later operations"
    ),
    "bad_input": "invalid calls are refused before communicating",
    "device_exchange": (
        "a Triton kernel's put_block + signal lands every row exactly in every peer's window "
        "before the signal, and counts its counter once the source may be reused "
        "(docs/device.md)"
    ),
    "device_refusals": (
        "a device call with a bad rank, range, source buffer or id returns its negative "
        "code, queues nothing and writes nothing (docs/device.md)"
    ),
    "device_timeout": (
        "a kernel waiting for a signal that never comes returns E_TIMEOUT within the "
        "communicator's timeout, and the host's error names the window, peer and signal"
    ),
}


class PeerStuck(AssertionError):
    """A contract saw a peer stuck in an operation (it will not return by itself): the
    conformance run stops, as it does when a rank hangs or an operation times out."""


def body_every_op(backend: str, device: str, dtype_name: str, count: int) -> int:
    """Run every operation of the API once at ``count`` elements; return #checks."""
    dtype = DTYPES[dtype_name]
    comm = new_comm(backend, device, name=unique_name("contract"))
    dev = comm.get_device()
    native = frozenset(type(comm.get_backend_impl()).supported_reduce_ops)
    r, n = comm.get_rank(), comm.get_size()
    checks = 0
    inputs = [values(k, count, dtype).to(dev) for k in range(n)]

    # all_reduce with every ReduceOp (sync), then async.
    for op in ops_for(dtype, native):
        if op == ReduceOp.PRODUCT:
            src = [product_values(k, count, dtype).to(dev) for k in range(n)]
        else:
            src = inputs
        t = src[r].clone()
        work = comm.all_reduce(t, op, async_op=False)
        assert work.status is WorkStatus.COMPLETED
        check(f"all_reduce {op}", t, reference(src, op))
        checks += 1
    t = inputs[r].clone()
    work = comm.all_reduce(t, ReduceOp.MAX, async_op=True)
    work.wait()
    assert work.is_completed() and work.status is WorkStatus.COMPLETED
    check("all_reduce async", t, reference(inputs, ReduceOp.MAX))

    # reduce: only the root's result is defined.
    for op in (ReduceOp.SUM, ReduceOp.MIN):
        t = inputs[r].clone()
        comm.reduce(t, n - 1, op, async_op=bool(r % 2)).wait()
        if r == n - 1:
            check(f"reduce {op}", t, reference(inputs, op))
    if dtype.is_floating_point:
        t = inputs[r].clone()
        comm.reduce(t, 0, ReduceOp.AVG)
        if r == 0:
            check("reduce AVG", t, reference(inputs, ReduceOp.AVG))

    t = inputs[r].clone()
    comm.broadcast(t, 1 % n)
    check("broadcast", t, inputs[1 % n])

    outs = [torch.empty(count, dtype=dtype, device=dev) for _ in range(n)]
    comm.all_gather(outs, inputs[r])
    for k in range(n):
        check(f"all_gather[{k}]", outs[k], inputs[k])
    flat = torch.empty(n * count, dtype=dtype, device=dev)
    comm.all_gather_single(flat, inputs[r], async_op=True).wait()
    check("all_gather_single", flat, torch.cat(inputs))
    v_inputs = [values(k, count + k, dtype, salt=1).to(dev) for k in range(n)]
    v_outs = [torch.empty(count + k, dtype=dtype, device=dev) for k in range(n)]
    comm.all_gather_v(v_outs, v_inputs[r])
    for k in range(n):
        check(f"all_gather_v[{k}]", v_outs[k], v_inputs[k])

    # reduce_scatter: block k of every rank's input is reduced into rank k.
    blocks = {k: [values(k, count, dtype, salt=j).to(dev) for j in range(n)] for k in range(n)}
    for op in (ReduceOp.SUM, ReduceOp.MAX):
        out = torch.empty(count, dtype=dtype, device=dev)
        comm.reduce_scatter(out, [b.clone() for b in blocks[r]], op)
        check(f"reduce_scatter {op}", out, reference([blocks[k][r] for k in range(n)], op))
        out = torch.empty(count, dtype=dtype, device=dev)
        comm.reduce_scatter_single(out, torch.cat(blocks[r]), op)
        check(f"reduce_scatter_single {op}", out, reference([blocks[k][r] for k in range(n)], op))
    if dtype.is_floating_point:
        out = torch.empty(count, dtype=dtype, device=dev)
        comm.reduce_scatter_single(out, torch.cat(blocks[r]), ReduceOp.AVG)
        check(
            "reduce_scatter_single AVG",
            out,
            reference([blocks[k][r] for k in range(n)], ReduceOp.AVG),
        )
    v_blocks = {
        k: [values(k, count + j, dtype, salt=j).to(dev) for j in range(n)] for k in range(n)
    }
    out = torch.empty(count + r, dtype=dtype, device=dev)
    comm.reduce_scatter_v(out, v_blocks[r], ReduceOp.SUM)
    check("reduce_scatter_v", out, reference([v_blocks[k][r] for k in range(n)], ReduceOp.SUM))

    # all_to_all: block j of rank k lands in slot k of rank j.
    outs = [torch.empty(count, dtype=dtype, device=dev) for _ in range(n)]
    comm.all_to_all(outs, [b.clone() for b in blocks[r]])
    for k in range(n):
        check(f"all_to_all[{k}]", outs[k], blocks[k][r])
    a2a_out = torch.empty(n * count, dtype=dtype, device=dev)
    comm.all_to_all_single(a2a_out, torch.cat(blocks[r]))
    check("all_to_all_single", a2a_out, torch.cat([blocks[k][r] for k in range(n)]))
    in_splits = [count + j for j in range(n)]
    out_splits = [count + r for _ in range(n)]
    a2av_out = torch.empty(sum(out_splits), dtype=dtype, device=dev)
    comm.all_to_all_v_single(a2av_out, torch.cat(v_blocks[r]), out_splits, in_splits)
    check("all_to_all_v_single", a2av_out, torch.cat([v_blocks[k][r] for k in range(n)]))

    root = n - 1
    out = torch.empty(count, dtype=dtype, device=dev)
    comm.scatter(out, [b.clone() for b in blocks[root]] if r == root else [], root)
    check("scatter", out, blocks[root][r])
    gathered = [torch.empty(count, dtype=dtype, device=dev) for _ in range(n)] if r == 0 else []
    comm.gather(gathered, inputs[r], 0)
    if r == 0:
        for k in range(n):
            check(f"gather[{k}]", gathered[k], inputs[k])
    gs = torch.empty(n * count if r == 0 else 0, dtype=dtype, device=dev)
    comm.gather_single(gs, inputs[r], 0)
    if r == 0:
        check("gather_single", gs, torch.cat(inputs))

    # Point to point: a ring, async sends and blocking receives.
    right, left = (r + 1) % n, (r - 1) % n
    got = torch.empty(count, dtype=dtype, device=dev)
    sw = comm.send(inputs[r], right, async_op=True)
    comm.recv(got, left)
    sw.wait()
    check("send/recv ring", got, inputs[left])
    got = torch.empty(count, dtype=dtype, device=dev)
    batch = comm.batch_op_create()
    batch.send(inputs[r], right).recv(got, left)
    batch.issue(async_op=True).wait()
    check("batch ring", got, inputs[left])

    comm.barrier()
    comm.barrier(async_op=True).wait()
    comm.finalize()
    return checks


def body_api_shapes(backend: str, device: str, count: int) -> int:
    """Every operation once, checking only what the API promises whatever the values.

    Each call returns a completed ``TorchWork`` (synchronous) or one that completes on
    ``wait()`` (asynchronous); outputs keep their shape, dtype and device; ``split``
    gives a communicator of the members' size and rank. Backends that do not really
    communicate (``communicates = False``, e.g. ``fake``) pass these too. Returns #calls.
    """
    comm = new_comm(backend, device, name=unique_name("contract-shape"))
    dev = comm.get_device()
    r, n = comm.get_rank(), comm.get_size()
    calls = 0

    def settled(work: Any, what: str, async_op: bool) -> None:
        nonlocal calls
        if async_op:
            work.wait()
        if work.status is not WorkStatus.COMPLETED or not work.is_completed():
            raise AssertionError(f"{what}: work ended {work.status}, expected COMPLETED")
        calls += 1

    def same_shape(t: torch.Tensor, like: tuple[int, ...], what: str) -> None:
        if tuple(t.shape) != like or t.dtype != torch.float32 or t.device.type != dev.type:
            raise AssertionError(f"{what}: output became {t.shape} {t.dtype} on {t.device}")

    def x() -> torch.Tensor:
        return torch.full((count,), float(r), device=dev)

    for async_op in (False, True):
        t = x()
        settled(comm.all_reduce(t, ReduceOp.SUM, async_op=async_op), "all_reduce", async_op)
        same_shape(t, (count,), "all_reduce")
        settled(comm.broadcast(x(), 0, async_op=async_op), "broadcast", async_op)
        settled(comm.reduce(x(), 0, ReduceOp.MAX, async_op=async_op), "reduce", async_op)
        outs = [torch.empty(count, device=dev) for _ in range(n)]
        settled(comm.all_gather(outs, x(), async_op=async_op), "all_gather", async_op)
        flat = torch.empty(n * count, device=dev)
        settled(comm.all_gather_single(flat, x(), async_op=async_op), "all_gather_single", async_op)
        same_shape(flat, (n * count,), "all_gather_single")
        out = torch.empty(count, device=dev)
        ins = [x() for _ in range(n)]
        settled(
            comm.reduce_scatter(out, ins, ReduceOp.SUM, async_op=async_op),
            "reduce_scatter",
            async_op,
        )
        settled(
            comm.reduce_scatter_single(out, torch.cat(ins), ReduceOp.SUM, async_op=async_op),
            "reduce_scatter_single",
            async_op,
        )
        outs = [torch.empty(count, device=dev) for _ in range(n)]
        settled(comm.all_to_all(outs, ins, async_op=async_op), "all_to_all", async_op)
        settled(
            comm.all_to_all_single(flat, torch.cat(ins), async_op=async_op),
            "all_to_all_single",
            async_op,
        )
        splits = [count] * n
        settled(
            comm.all_to_all_v_single(flat, torch.cat(ins), splits, splits, async_op=async_op),
            "all_to_all_v_single",
            async_op,
        )
        settled(comm.scatter(out, ins if r == 0 else [], 0, async_op=async_op), "scatter", async_op)
        gathered = [torch.empty(count, device=dev) for _ in range(n)] if r == 0 else []
        settled(comm.gather(gathered, x(), 0, async_op=async_op), "gather", async_op)
        settled(comm.barrier(async_op=async_op), "barrier", async_op)
        right, left = (r + 1) % n, (r - 1) % n
        batch = comm.batch_op_create()
        batch.send(x(), right).recv(torch.empty(count, device=dev), left)
        settled(batch.issue(async_op=async_op), "batch_op_issue", async_op)
        same_shape(out, (count,), "scatter")
    sub = comm.split(list(range(n)), "shape-all")
    if sub is None or (sub.get_rank(), sub.get_size()) != (r, n):
        raise AssertionError(f"split of every rank gave {sub!r} on rank {r}")
    settled(sub.all_reduce(x(), ReduceOp.SUM), "all_reduce on the split", False)
    sub.finalize()
    comm.finalize()
    return calls


def body_split(backend: str, device: str) -> tuple[int, int, float]:
    """Split into halves (and a group some ranks skip with ``[]``); reduce in each."""
    comm = new_comm(backend, device, name=unique_name("contract-split"))
    dev = comm.get_device()
    r, n = comm.get_rank(), comm.get_size()
    half = max(1, n // 2)
    mine = list(range(half)) if r < half else list(range(half, n))
    sub = comm.split(mine, "half")
    if sub is None or sub.get_size() != len(mine) or sub.get_rank() != mine.index(r):
        raise AssertionError(f"split: rank {r} got {sub!r} for members {mine}")
    t = torch.tensor([float(r)], device=dev)
    sub.all_reduce(t, ReduceOp.SUM)
    check("split all_reduce", t.cpu(), torch.tensor([float(sum(mine))]))
    firsts = comm.split([0] if r == 0 else [], "first")
    if (firsts is None) != (r != 0):
        raise AssertionError(f"split with []: rank {r} got {firsts!r}")
    if firsts is not None:
        firsts.finalize()
    p = torch.ones(2, device=dev)
    comm.all_reduce(p, ReduceOp.SUM)
    check("parent after split", p.cpu(), torch.full((2,), float(n)))
    sub.finalize()
    comm.finalize()
    return sub.get_rank(), sub.get_size(), float(t.item())


def body_batch_ring(backend: str, device: str, count: int) -> None:
    """A ring exchange issued as one batch, receives listed before sends."""
    comm = new_comm(backend, device, name=unique_name("contract-batch"))
    dev = comm.get_device()
    r, n = comm.get_rank(), comm.get_size()
    right, left = (r + 1) % n, (r - 1) % n
    got_left = torch.empty(count, device=dev)
    got_right = torch.empty(count, device=dev)
    batch = comm.batch_op_create()
    batch.recv(got_left, left).recv(got_right, right)
    mine = torch.full((count,), float(r), device=dev)
    batch.send(mine, right).send(mine, left)
    batch.issue(async_op=True).wait()
    check("batch from left", got_left.cpu(), torch.full((count,), float(left)))
    check("batch from right", got_right.cpu(), torch.full((count,), float(right)))
    comm.finalize()


def body_timeout(
    backend: str, device: str, seconds: float, patience_s: float = 30.0
) -> dict[str, Any]:
    """A receive nobody answers must time out within its timeout and mark the work.

    Rank 0 receives from rank 1 with a timeout of ``seconds``; every other rank stays alive
    and silent until rank 0 is done, at most ``patience_s`` (then rank 1 reports rank 0
    stuck), so no peer's departure can end the receive before its timeout does.
    """
    comm = new_comm(backend, device, name=unique_name("contract-timeout"))
    r = comm.get_rank()
    result: dict[str, Any] = {"rank": r}
    store = _side_store()
    key = unique_name("timeout-done")
    if r == 0:
        start = time.monotonic()
        work = comm.recv(
            torch.empty(1, device=comm.get_device()),
            1,
            async_op=True,
            timeout=timedelta(seconds=seconds),
        )
        try:
            work.wait()
        except CommTimeoutError:
            result["status"] = work.status.name
        except Exception as exc:  # reported by the test, with the rule
            result["status"] = f"{work.status.name} ({type(exc).__name__}: {exc})"
        else:
            result["status"] = "completed without a sender"
        result["seconds"] = time.monotonic() - start
        store.set(key, "done")
        try:
            comm.barrier()
        except CommStateError:
            result["after"] = "refused"
    else:  # every other rank stays alive and silent until rank 0 is done
        try:
            store.wait([key], timedelta(seconds=patience_s))
        except Exception:
            if r != 1:
                raise
            raise PeerStuck(
                f"{RULES['recv_timeout']}: rank 0's recv with a {seconds:g} s timeout has not "
                f"returned after {patience_s:.0f} s while rank 1 stayed alive and silent: the "
                f"backend's recv does not honour the timeout it is given"
            ) from None
    comm.abort() if comm.is_abort_supported() else comm.finalize()
    return result


def body_bad_inputs(backend: str, device: str) -> list[str]:
    """Invalid calls are refused before communicating (no rank waits on another)."""
    comm = new_comm(backend, device, name=unique_name("contract-input"))
    dev = comm.get_device()
    n = comm.get_size()
    not_a_tensor: Any = [1.0]
    calls: list[tuple[Callable[[], object], type[Exception]]] = [
        (lambda: comm.all_reduce(not_a_tensor, ReduceOp.SUM), CommTypeError),
        (lambda: comm.broadcast(torch.ones(2, device=dev), n), CommInputError),
        (
            lambda: comm.all_gather(
                [torch.empty(2, device=dev)] * (n + 1), torch.ones(2, device=dev)
            ),
            CommInputError,
        ),
        (
            lambda: comm.all_gather_single(
                torch.empty(2 * n + 1, device=dev), torch.ones(2, device=dev)
            ),
            CommInputError,
        ),
        (
            lambda: comm.reduce_scatter_single(
                torch.empty(2, device=dev),
                torch.ones(2 * n, dtype=torch.float64, device=dev),
                ReduceOp.SUM,
            ),
            CommInputError,
        ),
        (lambda: comm.all_reduce(torch.ones(2, device="meta"), ReduceOp.SUM), CommInputError),
        (lambda: comm.split([0, 0], "dup"), CommInputError),
    ]
    messages = []
    for call, exc in calls:
        try:
            call()
        except exc as err:
            messages.append(str(err))
        else:
            raise AssertionError(f"expected {exc.__name__} from a bad call, got none")
    comm.barrier()  # the communicator still works after refusing bad input
    comm.finalize()
    try:
        comm.barrier()
    except CommStateError as err:
        messages.append(str(err))
    return messages


# -- messages larger than the kernel's socket buffers ------------------------------------


def large_dtype(declared: tuple[torch.dtype, ...]) -> torch.dtype | None:
    """The element type of the large contracts: the first of float32, float64, int32,
    int64 the backend declares (their sums of the contracts' values are exact)."""
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        if dtype in declared:
            return dtype
    return None


def large_count(dtype: torch.dtype) -> int:
    """Elements of one large message: ``LARGE_MESSAGE_BYTES`` plus a few, uneven."""
    return LARGE_MESSAGE_BYTES // torch.empty(0, dtype=dtype).element_size() + UNEVEN_EXTRA


#: Per dtype, ``j % 61 + 1`` for j = 0, 1, ...: every ``pattern`` is a slice of it.
_ramps: dict[torch.dtype, torch.Tensor] = {}


def pattern(
    rank: int, block: int, count: int, dtype: torch.dtype, *, copy: bool = True
) -> torch.Tensor:
    """Rank ``rank``'s values for block ``block``: small integers (sums stay exact) that
    differ by rank, block and position, so a misplaced or truncated block is seen.

    Element ``i`` is ``(i + 7 * block + 13 * rank) % 61 + 1``. ``copy=False`` returns a
    read-only view of a cached ramp (for expected values: nothing is computed).
    """
    shift = (7 * block + 13 * rank) % 61
    ramp = _ramps.get(dtype)
    if ramp is None or ramp.numel() < shift + count:
        i = torch.arange(max(count + 61, 2 * (ramp.numel() if ramp is not None else 0)))
        ramp = _ramps[dtype] = (i % 61 + 1).to(dtype)
    view = ramp[shift : shift + count]
    return view.clone() if copy else view


def _summed(n: int, block: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    out = pattern(0, block, count, dtype)
    for k in range(1, n):
        out += pattern(k, block, count, dtype, copy=False)
    return out


def _side_store() -> Any:
    """A client of the launcher's store, to coordinate ranks without the backend."""
    import os

    from torch._C._distributed_c10d import TCPStore

    return TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        None,
        False,
        timedelta(seconds=30),
    )


def body_send_before_recv(backend: str, device: str, limit_s: float) -> float:
    """Rank 0 sends a large message to rank 1 before rank 1 posts its receive.

    The send (``async_op=True``) must return within ``limit_s`` although nobody receives
    yet; rank 1 receives only once told that it returned, then the work must complete
    and the data arrive intact. Returns the seconds the send took to return (rank 0).
    """
    comm = new_comm(backend, device, name=unique_name("contract-send-first"))
    dev = comm.get_device()
    r = comm.get_rank()
    dtype = large_dtype(tuple(type(comm.get_backend_impl()).supported_dtypes)) or torch.float32
    count = large_count(dtype)
    store = _side_store()
    key = unique_name("send-before-recv")
    took = 0.0
    if r == 0:
        data = pattern(0, 0, count, dtype).to(dev)
        start = time.monotonic()
        work = comm.send(data, 1, async_op=True)
        took = time.monotonic() - start
        store.set(key, f"{took:.3f}")
        work.wait()
        if not work.is_completed():
            raise AssertionError(
                f"{RULES['send_before_recv']}: rank 0's send work did not report completion "
                f"after wait() returned"
            )
    elif r == 1:
        try:
            store.wait([key], timedelta(seconds=limit_s))
        except Exception:
            raise PeerStuck(
                f"{RULES['send_before_recv']}: rank 0's send(async_op=True) of "
                f"{count} {str(dtype).replace('torch.', '')} elements "
                f"({count * torch.empty(0, dtype=dtype).element_size() / 2**20:.1f} MiB) to "
                f"rank 1 did not return within {limit_s:.0f} s while rank 1 had not posted its "
                f"receive: the send blocks until the peer reads, so any exchange where both "
                f"peers send first deadlocks once messages exceed the socket buffers. Queue "
                f"the send (a thread or the engine's progress loop) and return a work"
            ) from None
        got = torch.zeros(count, dtype=dtype, device=dev)
        comm.recv(got, 0)
        check(
            "send before recv: rank 1 received", got.cpu(), pattern(0, 0, count, dtype, copy=False)
        )
    comm.finalize()
    return took


def body_large_p2p(backend: str, device: str) -> int:
    """Rings of large messages in both directions: async sends first, then receives
    (plain and as a batch). Every rank sends before it receives, so a send that waits for
    the peer's receive deadlocks here. Returns the bytes this rank received."""
    comm = new_comm(backend, device, name=unique_name("contract-large-p2p"))
    dev = comm.get_device()
    r, n = comm.get_rank(), comm.get_size()
    dtype = large_dtype(tuple(type(comm.get_backend_impl()).supported_dtypes)) or torch.float32
    count = large_count(dtype)
    right, left = (r + 1) % n, (r - 1) % n
    mine = pattern(r, 0, count, dtype).to(dev)
    got = torch.empty(count, dtype=dtype, device=dev)
    work = comm.send(mine, right, async_op=True)
    comm.recv(got, left)
    work.wait()
    check(
        "send/recv ring (16 MiB, async send first)",
        got.cpu(),
        pattern(left, 0, count, dtype, copy=False),
    )
    # Both directions at once, uneven sizes, as one batch listing its sends first.
    small = count - r  # a different size per rank
    from_left = torch.empty(count - left, dtype=dtype, device=dev)
    from_right = torch.empty(count - right, dtype=dtype, device=dev)
    batch = comm.batch_op_create()
    batch.send(mine[:small], right).send(mine[:small], left)
    batch.recv(from_left, left).recv(from_right, right)
    batch.issue(async_op=True).wait()
    check(
        "batch ring from the left",
        from_left.cpu(),
        pattern(left, 0, count - left, dtype, copy=False),
    )
    check(
        "batch ring from the right",
        from_right.cpu(),
        pattern(right, 0, count - right, dtype, copy=False),
    )
    comm.finalize()
    return (2 * count - left - right) * mine.element_size()


def body_large_collectives(backend: str, device: str) -> list[str]:
    """Every collective once with messages of ``LARGE_MESSAGE_BYTES`` and uneven sizes.

    Every rank-to-rank message is at least that large. Buffers are allocated per operation
    and every result is checked exactly. Returns the operations checked.
    """
    comm = new_comm(backend, device, name=unique_name("contract-large"))
    dev = comm.get_device()
    r, n = comm.get_rank(), comm.get_size()
    dtype = large_dtype(tuple(type(comm.get_backend_impl()).supported_dtypes)) or torch.float32
    count = large_count(dtype)
    done: list[str] = []

    def pat(rank: int, block: int, size: int = count) -> torch.Tensor:
        return pattern(rank, block, size, dtype).to(dev)

    def ok(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        check(f"{name} ({count} elements per message)", got.cpu(), want)
        done.append(name)

    t = pat(r, 0)
    comm.all_reduce(t, ReduceOp.SUM)
    ok("all_reduce SUM", t, _summed(n, 0, count, dtype))
    t = pat(r, 0)
    comm.reduce(t, n - 1, ReduceOp.SUM)
    if r == n - 1:  # only the root's result is defined
        check("reduce SUM", t.cpu(), _summed(n, 0, count, dtype))
    done.append("reduce SUM")
    root = 1 % n
    t = pat(r, 0)
    comm.broadcast(t, root)
    ok("broadcast", t, pattern(root, 0, count, dtype, copy=False))
    del t

    outs = [torch.empty(count, dtype=dtype, device=dev) for _ in range(n)]
    comm.all_gather(outs, pat(r, 0))
    for k in range(n):
        check(f"all_gather[{k}]", outs[k].cpu(), pattern(k, 0, count, dtype, copy=False))
    done.append("all_gather")
    flat = torch.empty(n * count, dtype=dtype, device=dev)
    comm.all_gather_single(flat, pat(r, 0))
    for k in range(n):
        check(f"all_gather_single[{k}]", flat[k * count : (k + 1) * count].cpu(), outs[k].cpu())
    done.append("all_gather_single")
    del outs
    v_outs = [torch.empty(count + k, dtype=dtype, device=dev) for k in range(n)]
    comm.all_gather_v(v_outs, pat(r, 1, count + r))
    for k in range(n):
        check(f"all_gather_v[{k}]", v_outs[k].cpu(), pattern(k, 1, count + k, dtype, copy=False))
    done.append("all_gather_v")
    del v_outs

    # Block j of rank k goes to rank j: this rank's result sums block r of every rank.
    mine = [pat(r, j) for j in range(n)]
    out = torch.empty(count, dtype=dtype, device=dev)
    comm.reduce_scatter(out, mine, ReduceOp.SUM)
    ok("reduce_scatter SUM", out, _summed(n, r, count, dtype))
    torch.cat(mine, out=flat)
    comm.reduce_scatter_single(out, flat, ReduceOp.SUM)
    ok("reduce_scatter_single SUM", out, _summed(n, r, count, dtype))
    v_mine = [pat(r, j, count + j) for j in range(n)]
    v_out = torch.empty(count + r, dtype=dtype, device=dev)
    comm.reduce_scatter_v(v_out, v_mine, ReduceOp.SUM)
    ok("reduce_scatter_v SUM", v_out, _summed(n, r, count + r, dtype))

    outs = [torch.empty(count, dtype=dtype, device=dev) for _ in range(n)]
    comm.all_to_all(outs, mine)
    for k in range(n):
        check(f"all_to_all[{k}]", outs[k].cpu(), pattern(k, r, count, dtype, copy=False))
    done.append("all_to_all")
    a2a = torch.empty(n * count, dtype=dtype, device=dev)
    comm.all_to_all_single(a2a, flat)
    for k in range(n):
        check(f"all_to_all_single[{k}]", a2a[k * count : (k + 1) * count].cpu(), outs[k].cpu())
    done.append("all_to_all_single")
    del outs, a2a
    in_splits = [count + j for j in range(n)]
    out_splits = [count + r] * n
    a2av = torch.empty(sum(out_splits), dtype=dtype, device=dev)
    comm.all_to_all_v_single(a2av, torch.cat(v_mine), out_splits, in_splits)
    for k, piece in enumerate(torch.split(a2av, out_splits)):
        check(f"all_to_all_v_single[{k}]", piece.cpu(), pattern(k, r, count + r, dtype, copy=False))
    done.append("all_to_all_v_single")
    del a2av, v_mine, v_out

    root = n - 1
    comm.scatter(out, mine if r == root else [], root)
    ok("scatter", out, pattern(root, r, count, dtype, copy=False))
    del mine
    gathered = [torch.empty(count, dtype=dtype, device=dev) for _ in range(n)] if r == 0 else []
    comm.gather(gathered, pat(r, 2), 0)
    for k, g in enumerate(gathered):
        check(f"gather[{k}]", g.cpu(), pattern(k, 2, count, dtype, copy=False))
    del gathered
    done.append("gather")
    whole = torch.empty(n * count if r == 0 else 0, dtype=dtype, device=dev)
    comm.gather_single(whole, pat(r, 2), 0)
    if r == 0:
        for k in range(n):
            check(
                f"gather_single[{k}]",
                whole[k * count : (k + 1) * count].cpu(),
                pattern(k, 2, count, dtype, copy=False),
            )
    done.append("gather_single")
    comm.finalize()
    return done

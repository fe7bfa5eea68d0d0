"""The conformance contracts on large messages: point-to-point and every collective with
messages larger than the kernel's socket buffers, and a send that must not wait for its
receive (``test_conformance`` runs them; the rules they check are ``contracts.RULES``).
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch

from torchcomms_core.comm.create import new_comm
from torchcomms_core.operations.reduce_op import ReduceOp
from torchcomms_core.testing.contracts import (
    AG_V,
    LARGE_MESSAGE_BYTES,
    RS_V,
    RULES,
    UNEVEN_EXTRA,
    PeerStuck,
    side_store,
)
from torchcomms_core.testing.pool import unique_name
from torchcomms_core.testing.reference import check


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
    store = side_store()
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
    getattr(comm, AG_V)(v_outs, pat(r, 1, count + r))
    for k in range(n):
        check(f"{AG_V}[{k}]", v_outs[k].cpu(), pattern(k, 1, count + k, dtype, copy=False))
    done.append(AG_V)
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
    getattr(comm, RS_V)(v_out, v_mine, ReduceOp.SUM)
    ok(f"{RS_V} SUM", v_out, _summed(n, r, count + r, dtype))

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

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
from torchcomms_core.operations.table import forwarding
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
# The uneven forms of all_gather and reduce_scatter (the operation table's ``uneven_of``):
# each is checked with blocks of different sizes, against the reference.
AG_V = forwarding()["all_gather"]
RS_V = forwarding()["reduce_scatter"]

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
    "tags": (
        "a nonzero tag is matched or refused, never dropped: a backend with native "
        "send_tagged/recv_tagged lands two messages sent under different tags in receives "
        "posted in the opposite order, one without refuses the tag with NotImplementedError; "
        "a native recv_anysource names every sender and takes only its tag"
    ),
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
    getattr(comm, AG_V)(v_outs, v_inputs[r])
    for k in range(n):
        check(f"{AG_V}[{k}]", v_outs[k], v_inputs[k])

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
    getattr(comm, RS_V)(out, v_blocks[r], ReduceOp.SUM)
    check(RS_V, out, reference([v_blocks[k][r] for k in range(n)], ReduceOp.SUM))

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


def body_tags_and_any_source(backend: str, device: str, count: int) -> dict[str, Any]:
    """Tags crossed between ranks 0 and 1, then receives from any source on rank 0, each
    where the backend declares it native; a nonzero tag refused where it does not."""
    from torchcomms_core.comm import anysource, tagged

    comm = new_comm(backend, device, name=unique_name("contract-tags"))
    dev = comm.get_device()
    r, n = comm.get_rank(), comm.get_size()
    support = comm.method_support()
    out: dict[str, Any] = {
        "tags": support["send_tagged"] == support["recv_tagged"] == "native",
        "any": support["recv_anysource"] == "native",
    }
    if not out["tags"]:
        try:
            tagged.send(comm, torch.ones(1, device=dev), (r + 1) % n, 5)
        except NotImplementedError as exc:
            out["refused"] = "tag=5" in str(exc)
        comm.finalize()
        return out
    if r == 0:
        a, b = torch.full((count,), 1.0, device=dev), torch.full((count,), 2.0, device=dev)
        for w in [tagged.send(comm, a, 1, 7, True), tagged.send(comm, b, 1, 9, True)]:
            w.wait()
    elif r == 1:
        first, second = torch.zeros(count, device=dev), torch.zeros(count, device=dev)
        for w in [tagged.recv(comm, first, 0, 9, True), tagged.recv(comm, second, 0, 7, True)]:
            w.wait()
        check("tag 9 received first", first.cpu(), torch.full((count,), 2.0))
        check("tag 7 received second", second.cpu(), torch.full((count,), 1.0))
    if out["any"]:
        if r == 0:
            senders = []
            for _ in range(n - 1):
                got = torch.zeros(count, device=dev)
                work, source = anysource.recv_anysource(comm, got, True)
                work.wait()
                check("any source", got.cpu(), torch.full((count,), float(source())))
                senders.append(source())
            out["senders"] = sorted(senders)
            x, y = torch.zeros(2, device=dev), torch.zeros(2, device=dev)
            wy, source_y = anysource.recv_anysource(comm, y, True, tag=12)
            wx, _ = anysource.recv_anysource(comm, x, True, tag=11)
            wy.wait()
            wx.wait()
            out["tagged_any"] = [y[0].item(), x[0].item(), source_y()]
        else:
            comm.send(torch.full((count,), float(r), device=dev), 0)
            if r == n - 1:
                five, six = torch.full((2,), 5.0, device=dev), torch.full((2,), 6.0, device=dev)
                sends = [tagged.send(comm, five, 0, 11, True), tagged.send(comm, six, 0, 12, True)]
                for w in sends:
                    w.wait()
    comm.barrier()
    comm.finalize()
    return out


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
    store = side_store()
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


def side_store() -> Any:
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

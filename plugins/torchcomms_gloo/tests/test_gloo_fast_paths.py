"""Gloo's pairwise all-gather and reduce-scatter (torchcomms_gloo.fast_paths) over real ranks.

Every body runs on 2 and 4 gloo processes and checks its results exactly against values
computed from every rank's deterministic input.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

import torchcomms
from torchcomms import ReduceOp
from torchcomms_core.testing import unique_name
from torchcomms_gloo import fast_paths

#: Crossover the bodies set, so the pairwise paths run at sizes a test can afford.
MIN_BYTES = 64 << 10
#: Elements per rank: above that crossover for every dtype below, and not a whole number
#: of the small pieces the bodies set, so the last piece is a short one.
COUNT = (MIN_BYTES // 2) + 37


def _comm() -> torchcomms.TorchComm:
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("fast"))


@contextlib.contextmanager
def _counting(name: str) -> Iterator[list[int]]:
    """Count calls of ``fast_paths.<name>`` (the real function still runs)."""
    real = getattr(fast_paths, name)
    calls = [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    setattr(fast_paths, name, counted)
    try:
        yield calls
    finally:
        setattr(fast_paths, name, real)


@contextlib.contextmanager
def _low_crossover() -> Iterator[None]:
    names = ("ALL_GATHER_MIN_BYTES", "REDUCE_SCATTER_MIN_BYTES")
    saved = {name: getattr(fast_paths, name) for name in names}
    for name in names:
        setattr(fast_paths, name, MIN_BYTES)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(fast_paths, name, value)


@contextlib.contextmanager
def _small_pieces(nbytes: int) -> Iterator[None]:
    saved = fast_paths.PIECE_BYTES
    fast_paths.PIECE_BYTES = nbytes
    try:
        yield
    finally:
        fast_paths.PIECE_BYTES = saved


def _input(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Small distinct integers per rank and position: every reduction below is exact."""
    values = (torch.arange(numel, dtype=torch.int64) * 7 + rank * 3) % 13 + 1
    return values.to(dtype)


def _reference(op: str, chunks: list[torch.Tensor]) -> torch.Tensor:
    acc = chunks[0].clone()
    for c in chunks[1:]:
        if op == "sum" or op == "avg":
            acc = acc + c
        elif op == "product":
            acc = acc * c
        elif op == "min":
            acc = torch.minimum(acc, c)
        elif op == "max":
            acc = torch.maximum(acc, c)
        elif op == "band":
            acc = acc & c
        elif op == "bor":
            acc = acc | c
        else:
            acc = acc ^ c
    if op == "avg":
        acc = acc / len(chunks)
    return acc


_OPS = {
    "sum": ReduceOp.SUM,
    "product": ReduceOp.PRODUCT,
    "min": ReduceOp.MIN,
    "max": ReduceOp.MAX,
    "avg": ReduceOp.AVG,
    "band": ReduceOp.BAND,
    "bor": ReduceOp.BOR,
    "bxor": ReduceOp.BXOR,
}


def body_all_gather_forms(dtype_name: str) -> None:
    dtype = getattr(torch, dtype_name)
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    want = torch.cat([_input(s, COUNT, dtype) for s in range(n)])
    with _counting("all_gather") as calls, _low_crossover():
        out = torch.zeros(n * COUNT, dtype=dtype)
        comm.all_gather_single(out, _input(r, COUNT, dtype))
        assert torch.equal(out, want), "all_gather_single out of place"

        inplace = torch.zeros(n * COUNT, dtype=dtype)
        inplace[r * COUNT : (r + 1) * COUNT] = _input(r, COUNT, dtype)
        comm.all_gather_single(inplace, inplace[r * COUNT : (r + 1) * COUNT])
        assert torch.equal(inplace, want), "all_gather_single in place"

        outs = [torch.zeros(COUNT, dtype=dtype) for _ in range(n)]
        comm.all_gather(outs, _input(r, COUNT, dtype))
        assert torch.equal(torch.cat(outs), want), "all_gather list"
    assert calls[0] == 3, f"expected the pairwise path 3 times, took it {calls[0]} times"
    comm.finalize()


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16", "int64", "uint8"])
def test_all_gather_forms_above_the_crossover_are_exact(pool, dtype_name) -> None:
    pool.run(body_all_gather_forms, dtype_name)


def body_reduce_scatter_forms(dtype_name: str, op_name: str) -> None:
    dtype = getattr(torch, dtype_name)
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    inputs = [_input(s, n * COUNT, dtype) for s in range(n)]
    want = _reference(op_name, [x[r * COUNT : (r + 1) * COUNT] for x in inputs])
    op = _OPS[op_name]
    with _counting("reduce_scatter") as calls, _small_pieces(16 << 10), _low_crossover():
        out = torch.zeros(COUNT, dtype=dtype)
        comm.reduce_scatter_single(out, inputs[r].clone(), op)
        assert torch.equal(out, want), f"reduce_scatter_single {op_name} out of place"

        full = inputs[r].clone()
        mine = full[r * COUNT : (r + 1) * COUNT]
        comm.reduce_scatter_single(mine, full, op)
        assert torch.equal(mine, want), f"reduce_scatter_single {op_name} in place"

        out = torch.zeros(COUNT, dtype=dtype)
        comm.reduce_scatter(out, list(inputs[r].clone().chunk(n)), op)
        assert torch.equal(out, want), f"reduce_scatter {op_name} list"
    assert calls[0] == 3, f"expected the pairwise path 3 times, took it {calls[0]} times"
    comm.finalize()


@pytest.mark.parametrize(
    ("dtype_name", "op_name"),
    [
        ("float32", "sum"),
        ("float32", "avg"),
        ("float32", "max"),
        ("float64", "product"),
        ("bfloat16", "sum"),
        ("int32", "min"),
        ("int64", "bxor"),
        ("uint8", "band"),
        ("int8", "bor"),
    ],
)
def test_reduce_scatter_forms_above_the_crossover_are_exact(pool, dtype_name, op_name) -> None:
    pool.run(body_reduce_scatter_forms, dtype_name, op_name)


def body_small_sizes_use_the_engine() -> None:
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    count = 5
    with _counting("all_gather") as gathers, _counting("reduce_scatter") as scatters:
        out = torch.zeros(n * count)
        comm.all_gather_single(out, _input(r, count, torch.float32))
        assert torch.equal(out, torch.cat([_input(s, count, torch.float32) for s in range(n)]))
        red = torch.zeros(count)
        comm.reduce_scatter_single(red, _input(r, n * count, torch.float32), ReduceOp.SUM)
        want = sum(
            _input(s, n * count, torch.float32)[r * count : (r + 1) * count] for s in range(n)
        )
        assert torch.equal(red, want)
    assert gathers[0] == 0 and scatters[0] == 0, "small sizes must stay on the engine"
    comm.finalize()


def test_sizes_below_the_crossover_use_the_engines_collectives(pool) -> None:
    pool.run(body_small_sizes_use_the_engine)


def body_concurrent_async() -> None:
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    inputs = [[_input(s + 10 * k, n * COUNT, torch.float32) for s in range(n)] for k in range(3)]
    outs = [torch.zeros(COUNT) for _ in range(3)]
    gathered = torch.zeros(n * COUNT)
    with _low_crossover():
        works = [
            comm.reduce_scatter_single(outs[k], inputs[k][r], ReduceOp.SUM, async_op=True)
            for k in range(3)
        ]
        mine = _input(r, COUNT, torch.float32)
        gwork = comm.all_gather_single(gathered, mine, async_op=True)
    # A user's own point-to-point traffic in between never matches the collectives' messages.
    peer = (r + 1) % n
    got = torch.zeros(8)
    comm.batch_op_create().send(torch.full((8,), float(r)), peer).recv(got, (r - 1) % n).issue()
    assert torch.equal(got, torch.full((8,), float((r - 1) % n)))
    for k in reversed(range(3)):  # waited out of order on purpose
        works[k].wait()
        want = sum(inputs[k][s][r * COUNT : (r + 1) * COUNT] for s in range(n))
        assert torch.equal(outs[k], want), f"async reduce_scatter_single #{k}"
    gwork.wait()
    assert torch.equal(gathered, torch.cat([_input(s, COUNT, torch.float32) for s in range(n)]))
    comm.finalize()


def test_concurrent_async_collectives_and_user_p2p_do_not_mix(pool) -> None:
    pool.run(body_concurrent_async)


def body_scratch_is_reused() -> int:
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    x = _input(r, n * COUNT, torch.float32)
    out = torch.zeros(COUNT)
    with _low_crossover():
        comm.reduce_scatter_single(out, x, ReduceOp.SUM)
    pool = comm.get_backend_impl()._scratch
    first = [b.data_ptr() for b in pool._free]
    with _low_crossover():
        comm.reduce_scatter_single(out, x, ReduceOp.SUM)
    assert [b.data_ptr() for b in pool._free] == first, "receive buffer not reused"
    comm.finalize()
    return len(first)


def test_reduce_scatter_reuses_its_receive_buffer(pool2) -> None:
    assert pool2.run(body_scratch_is_reused) == [1, 1]

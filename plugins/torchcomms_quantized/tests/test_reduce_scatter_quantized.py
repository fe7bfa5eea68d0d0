"""``reduce_scatter_quantized``: the reference's bfloat16 reduce-scatter with stochastic rounding.

The rounding itself is checked in one process (always a neighbour, exact values kept,
reproducible per seed and rank, unbiased); the collective over real gloo ranks (2 and 4):
16 MiB inputs, uneven chunks, the statistical mean of the rounding, the error bound,
bit-identical repeats for a seed, AVG, async_op, and refused arguments.

The statistical checks use Hoeffding's inequality: for ``N`` independent rounding
decisions, the observed fraction of round-ups strays from its expectation by more than
``t`` with probability at most ``2 exp(-2 N t**2)``. The tolerances below make that
``2 exp(-100)`` or less for any seed; the seeds are fixed besides, so the test is
deterministic.
"""

from __future__ import annotations

import math

import pytest
import torch

import torchcomms
from torchcomms import CommInputError, CommTypeError, ReduceOp, TorchComm, TorchWork
from torchcomms_core.testing import unique_name
from torchcomms_quantized.stochastic import round_bf16

STEP_AT_ONE = 2.0**-7  # bfloat16's spacing in [1, 2)
FRACTION = 0.25  # 1 + FRACTION * STEP_AT_ONE sits a quarter of the way to the next value


def _hoeffding_t(trials: int) -> float:
    """The deviation of a mean of ``trials`` [0, 1] variables exceeded with probability at
    most 2 exp(-100)."""
    return math.sqrt(100.0 / (2.0 * trials))


def _neighbours(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bfloat16 values just below and above each float32 magnitude (as float32)."""
    bits = x.view(torch.int32)
    lo = (bits & -(1 << 16)).view(torch.float32)
    hi = ((bits & -(1 << 16)) + (1 << 16)).view(torch.float32)
    return lo, hi


# -- the rounding, in one process ------------------------------------------------------------


def test_rounding_gives_a_neighbour_and_keeps_exact_and_non_finite_values() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1 << 16, generator=gen) * torch.logspace(-30, 30, 1 << 16)
    r = round_bf16(x, seed=5).float()
    lo, hi = _neighbours(x)
    assert bool(((r == lo) | (r == hi)).all())
    exact = torch.tensor([0.0, -0.0, 1.0, -2.5, 3.0 * 2**-100, 65280.0])
    assert torch.equal(round_bf16(exact, seed=9).float(), exact)
    # The last is a NaN whose payload sits in the low 16 bits only: it must stay a NaN.
    special = torch.tensor([0x7F800000, 0xFF800000 - (1 << 32), 0x7FC00000, 0x7F800001])
    out = round_bf16(special.to(torch.int32).view(torch.float32), seed=9).float()
    assert out[0] == float("inf") and out[1] == float("-inf")
    assert bool(out[2].isnan()) and bool(out[3].isnan())


def test_rounding_is_reproducible_per_seed_and_independent_per_rank() -> None:
    x = torch.full((1 << 16,), 1.0 + FRACTION * STEP_AT_ONE)
    a = round_bf16(x, seed=42, rank=0)
    assert torch.equal(a, round_bf16(x, seed=42, rank=0))
    assert not torch.equal(a, round_bf16(x, seed=42, rank=1))
    assert not torch.equal(a, round_bf16(x, seed=43, rank=0))
    # Ranks with the same seed round independently: they agree on a round-up about
    # FRACTION**2 of the time, not FRACTION.
    b = round_bf16(x, seed=42, rank=1)
    both = ((a.float() > 1.0) & (b.float() > 1.0)).double().mean().item()
    assert abs(both - FRACTION**2) < _hoeffding_t(x.numel())


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_rounding_is_unbiased_where_nearest_rounding_is_not(sign: float) -> None:
    n = 1 << 22
    x = torch.full((n,), sign * (1.0 + FRACTION * STEP_AT_ONE))
    up = (round_bf16(x, seed=2024).float().abs() > 1.0).double().mean().item()
    assert abs(up - FRACTION) < _hoeffding_t(n), up
    # Nearest rounding would never round these up: its mean error is FRACTION steps.
    assert bool((x.to(torch.bfloat16).float().abs() == 1.0).all())


def test_the_sum_of_rounding_errors_of_spread_values_is_centred() -> None:
    """Values of every magnitude: the errors e_i lie in [lo_i - x_i, hi_i - x_i], width
    s_i (one step), mean zero; Hoeffding bounds |sum e_i| by 10 sqrt(sum s_i**2 / 2) with
    probability 1 - 2 exp(-100)."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(1 << 20, generator=gen) * torch.logspace(-3, 3, 1 << 20)
    e = round_bf16(x, seed=11).double() - x.double()
    lo, hi = _neighbours(x.abs())
    steps = (hi - lo).double()
    assert abs(e.sum().item()) < 10.0 * math.sqrt((steps**2).sum().item() / 2.0)
    assert bool((e.abs() < steps).all())


# -- the collective over gloo ranks ------------------------------------------------------------


def _comm() -> TorchComm:
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("rsq"))


def _seed(value: int) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.int64)


def body_collective() -> dict:
    comm = _comm()
    n, r = comm.get_size(), comm.get_rank()
    out: dict = {}
    # 16 MiB of float32 per rank, a quarter of a step above 1: every output element is
    # n + k steps, k = how many ranks rounded up; k / n averages FRACTION.
    total = 1 << 22
    chunk = total // n
    x = torch.full((total,), 1.0 + FRACTION * STEP_AT_ONE)
    first = torch.empty(chunk)
    comm.reduce_scatter_quantized(first, x, ReduceOp.SUM, _seed(42 + r))
    k = (first - n) / STEP_AT_ONE
    out["whole_steps"] = bool((k == k.round()).all() and (k >= 0).all() and (k <= n).all())
    out["up_fraction"] = (k.double().mean() / n).item()
    out["trials"] = chunk * n
    again = torch.empty(chunk)
    comm.reduce_scatter_quantized(again, x, ReduceOp.SUM, _seed(42 + r))
    other = torch.empty(chunk)
    comm.reduce_scatter_quantized(other, x, ReduceOp.SUM, _seed(1000 + r))
    out["repeat_identical"] = torch.equal(first, again)
    out["other_seed_differs"] = not torch.equal(first, other)
    # The reference's test: ones, SUM, close to n.
    ones = torch.empty(1024)
    comm.reduce_scatter_quantized(ones, torch.ones(1024 * n), ReduceOp.SUM, _seed(42 + r))
    out["ones"] = bool((ones == n).all())
    # Spread values, an uneven chunk: within one step per rank of the exact sum, and AVG is
    # the sum divided by n, bit for bit.
    chunk = 12345
    gen = torch.Generator().manual_seed(100 + r)
    y = torch.randn(n * chunk, generator=gen) * torch.logspace(-4, 4, n * chunk)
    exact = y.double().clone()
    comm.all_reduce(exact, ReduceOp.SUM)
    absolute = y.abs().double()
    comm.all_reduce(absolute, ReduceOp.SUM)
    mine = slice(r * chunk, (r + 1) * chunk)
    summed = torch.empty(chunk)
    comm.reduce_scatter_quantized(summed, y, ReduceOp.SUM, _seed(7))
    # One bfloat16 step of x is at most |x| 2**-7; the float32 additions add < n 2**-23.
    bound = absolute[mine] * (2.0**-7 + n * 2.0**-23)
    error = (summed.double() - exact[mine]).abs()
    out["within_bound"] = bool((error <= bound).all())
    out["worst_ratio"] = float((error / bound.clamp_min(1e-300)).max())
    averaged = torch.empty(chunk)
    comm.reduce_scatter_quantized(averaged, y, ReduceOp.AVG, _seed(7))
    out["avg_is_sum_over_n"] = torch.equal(averaged, summed / torch.tensor(float(n)))
    # async_op: a work, the same bits once waited for.
    later = torch.empty(chunk)
    work = comm.reduce_scatter_quantized(later, y, ReduceOp.SUM, _seed(7), True)
    out["async_work"] = isinstance(work, TorchWork)
    work.wait()
    out["async_same"] = torch.equal(later, summed)
    out["errors"] = _refusals(comm, n)
    comm.finalize()
    return out


def _refusals(comm: TorchComm, n: int) -> dict[str, str]:
    """Each bad call's error type and message (all raised before any communication)."""
    good_out, good_in, seed = torch.empty(8), torch.ones(8 * n), _seed(1)
    cases = {
        "bf16": (good_out, good_in.bfloat16(), ReduceOp.SUM, seed),
        "numel": (good_out, torch.ones(8 * n + 1), ReduceOp.SUM, seed),
        "strided": (good_out, torch.ones(16 * n)[::2], ReduceOp.SUM, seed),
        "seed_int32": (good_out, good_in, ReduceOp.SUM, seed.int()),
        "seed_two": (good_out, good_in, ReduceOp.SUM, torch.tensor([1, 2])),
        "seed_int": (good_out, good_in, ReduceOp.SUM, 42),
        "max": (good_out, good_in, ReduceOp.MAX, seed),
    }
    found = {}
    for what, args in cases.items():
        try:
            comm.reduce_scatter_quantized(*args)
            found[what] = "no error"
        except (CommInputError, CommTypeError) as exc:
            found[what] = f"{type(exc).__name__}: {exc}"
    try:
        comm.reduce_scatter_quantized(good_out, good_in, ReduceOp.SUM, seed, block_size=8)
        found["kwarg"] = "no error"
    except CommTypeError as exc:
        found["kwarg"] = f"CommTypeError: {exc}"
    return found


def test_reduce_scatter_quantized_over_gloo(pool) -> None:
    results = pool.run(body_collective, timeout=300)
    for res in results:
        assert res["whole_steps"], res
        assert abs(res["up_fraction"] - FRACTION) < _hoeffding_t(res["trials"]), res
        assert res["repeat_identical"] and res["other_seed_differs"], res
        assert res["ones"], res
        assert res["within_bound"] and res["worst_ratio"] > 1e-3, res
        assert res["avg_is_sum_over_n"], res
        assert res["async_work"] and res["async_same"], res
        errors = res["errors"]
        assert "must be float32" in errors["bf16"], errors
        assert "output.numel() * size" in errors["numel"], errors
        assert "must be contiguous" in errors["strided"], errors
        assert "one-element int64" in errors["seed_int32"], errors
        assert "numel=2" in errors["seed_two"], errors
        assert errors["seed_int"].startswith("CommTypeError"), errors
        assert "SUM or ReduceOp.AVG" in errors["max"], errors
        assert errors["kwarg"].startswith("CommTypeError"), errors


# -- through torchcomms.distwrap, as the reference's own test calls it ---------------------------


def body_distwrap() -> dict:
    import os

    from torch import distributed as c10d

    from torchcomms import distwrap as dist

    rank, size = int(os.environ["TORCHCOMM_RANK"]), int(os.environ["TORCHCOMM_SIZE"])
    tcp = c10d.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store = c10d.PrefixStore(unique_name("rsq-distwrap"), tcp)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, use_torchcomms=True)
    out: dict = {}
    try:
        output = torch.zeros(1024)
        seed = torch.tensor([42 + rank], dtype=torch.int64)
        work = dist.reduce_scatter_quantized(
            output, torch.ones(size * 1024), dist.ReduceOp.SUM, seed, async_op=False
        )
        work.wait()  # the reference's test waits on the work of a synchronous call
        out["sync"] = bool((output == size).all())
        half = torch.zeros(512)
        work = dist.reduce_scatter_quantized(
            half, torch.full((size * 512,), 0.5), dist.ReduceOp.AVG, seed, async_op=True
        )
        work.wait()
        out["async_avg"] = bool((half == 0.5).all())
    finally:
        dist.destroy_process_group()
    return out


def test_distwrap_reduce_scatter_quantized_runs_on_gloo(pool2) -> None:
    assert pool2.run(body_distwrap, timeout=120) == [{"sync": True, "async_avg": True}] * 2


# -- on a GPU (scripts/gpu_checks.sh) -------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device; run scripts/gpu_checks.sh on a GPU machine",
)
def test_rounding_and_the_collective_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA's generator: unbiased and reproducible too; ncclx at world size 1 runs it."""
    from torch.distributed import HashStore

    dev = torch.device("cuda", 0)
    n = 1 << 22
    x = torch.full((n,), 1.0 + FRACTION * STEP_AT_ONE, device=dev)
    a = round_bf16(x, seed=3)
    assert a.device == dev and torch.equal(a, round_bf16(x, seed=3))
    up = (a.float() > 1.0).double().mean().item()
    assert abs(up - FRACTION) < _hoeffding_t(n), up
    for k, v in {"TORCHCOMM_RANK": "0", "TORCHCOMM_SIZE": "1", "TORCHCOMM_LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    comm = torchcomms.new_comm("ncclx", dev, name=unique_name("rsq-gpu"), store=HashStore())
    try:
        out = torch.empty(n, device=dev)
        seed = torch.tensor([42], dtype=torch.int64, device=dev)
        comm.reduce_scatter_quantized(out, x, ReduceOp.SUM, seed)
        torch.cuda.synchronize()
        lo, hi = 1.0, 1.0 + STEP_AT_ONE
        assert bool(((out == lo) | (out == hi)).all())
        up = (out > 1.0).double().mean().item()
        assert abs(up - FRACTION) < _hoeffding_t(n), up
        with pytest.raises(CommInputError, match="is on device cpu"):
            comm.reduce_scatter_quantized(out, x, ReduceOp.SUM, seed.cpu())
    finally:
        comm.finalize()

"""Tests of the torchcomms-quantized plugin: kernels, validation, dispatch, bounds, traffic.

Error bounds and bit-identical results are checked over real gloo ranks (2 and 4);
dispatch, validation and byte counts use the in-process memory backend.
"""

from __future__ import annotations

import math
import threading
from datetime import timedelta

import pytest
import torch
from memory_backend import MemoryBackend, _Fabric, run_threads

import torchcomms
from torchcomms import (
    Collective,
    CommInputError,
    CommOptions,
    CommTypeError,
    PluginError,
    ReduceOp,
    TorchComm,
    TorchWork,
    hookimpl,
)
from torchcomms_core.testing import unique_name
from torchcomms_quantized import (
    all_reduce_block_absmax,
    all_reduce_error_bound,
    dequantize_blocks,
    quantize_blocks,
    reduce_scatter_block_absmax,
    reduce_scatter_error_bound,
)
from torchcomms_quantized.quantization import FLUSH_BELOW, Layout

_group_ids = iter(range(1 << 30))


def _group(
    size: int, backend_cls: type[MemoryBackend] = MemoryBackend, device: torch.device | None = None
) -> list[TorchComm]:
    """Like ``make_group``, with a chosen backend class and device."""
    from torch.distributed import HashStore

    device = device or torch.device("cpu")
    name = f"quant-{next(_group_ids)}"
    fabric = _Fabric(size)
    store = HashStore()
    comms = []
    for rank in range(size):
        backend = backend_cls(fabric, rank)
        opts = CommOptions(
            timeout=timedelta(seconds=10),
            store=store,
            name=name,
            rank=rank,
            abort_process_on_timeout_or_error=False,
            size=size,
        )
        backend._bind(device, name, opts)
        backend.init(device, name, opts)
        comms.append(TorchComm(backend, device, name, opts, store))
    return comms


def _data(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Normal values whose magnitude spans six decades across rows, with a zero stretch."""
    gen = torch.Generator().manual_seed(seed)
    rows = shape[0]
    x = torch.randn(shape, generator=gen) * torch.logspace(-3, 2.5, rows).view(
        (rows,) + (1,) * (len(shape) - 1)
    )
    x.view(-1)[1000:1700] = 0.0
    return x.to(dtype)


# -- quantize / dequantize ---------------------------------------------------------------


def test_quantization_error_is_at_most_half_a_step_per_element() -> None:
    x = _data((64, 512), seed=1)
    q, scales = quantize_blocks(x, 256)
    assert q.dtype == torch.int8 and q.shape == x.shape
    assert scales.dtype == torch.float32 and scales.shape == (64, 2)
    back = dequantize_blocks(q, scales, 256)
    half_step = (scales / 2).repeat_interleave(256, dim=1)
    assert bool(((back - x).abs() <= half_step * (1 + 2.0**-20)).all())


def test_each_block_maps_its_largest_magnitude_to_127() -> None:
    x = _data((8, 1024), seed=2)
    q, scales = quantize_blocks(x, 128)
    absmax = x.view(8, 8, 128).abs().amax(-1)
    assert torch.equal(scales, absmax / torch.full_like(absmax, 127.0))
    nonzero = absmax > 0
    assert bool((q.view(8, 8, 128).abs().amax(-1)[nonzero] == 127).all())
    assert int(q.abs().max()) <= 127


def test_an_all_zero_block_has_scale_zero_and_comes_back_exactly_zero() -> None:
    x = torch.zeros(3, 256)
    x[1] = torch.linspace(-1, 1, 256)
    x[2, :] = FLUSH_BELOW / 4  # below the flush threshold: sent as zeros
    q, scales = quantize_blocks(x, 256)
    assert scales[0].item() == 0.0 and scales[2].item() == 0.0 and scales[1].item() > 0
    back = dequantize_blocks(q, scales, 256)
    assert torch.equal(back[0], torch.zeros(256)) and torch.equal(back[2], torch.zeros(256))
    assert bool(back.isfinite().all())


def test_a_non_finite_block_stays_non_finite_and_leaves_others_alone() -> None:
    x = torch.ones(4, 64)
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    q, scales = quantize_blocks(x, 64)
    back = dequantize_blocks(q, scales, 64)
    assert not bool(back[1].isfinite().any()) and not bool(back[2].isfinite().any())
    assert torch.equal(back[0], x[0]) and torch.equal(back[3], x[3])


def test_dequantize_accumulates_into_out() -> None:
    a, b = _data((4, 512), seed=3), _data((4, 512), seed=4)
    qa, sa = quantize_blocks(a, 256)
    qb, sb = quantize_blocks(b, 256)
    acc = dequantize_blocks(qa, sa, 256)
    dequantize_blocks(qb, sb, 256, out=acc, accumulate=True)
    expected = dequantize_blocks(qa, sa, 256) + dequantize_blocks(qb, sb, 256)
    assert torch.equal(acc, expected)


def test_a_length_that_is_not_whole_blocks_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of block_size=256"):
        quantize_blocks(torch.ones(300), 256)


def test_the_wire_layout_packs_scales_and_payload_in_aligned_rows() -> None:
    layout = Layout(rows=3, cols=300, block_size=100)
    assert layout.width == 3 * 4 + 300 and layout.width % 4 == 0
    odd = Layout(rows=2, cols=9, block_size=3)
    assert odd.width == 3 * 4 + 9 + 3  # padded to keep every row 4-byte aligned
    x = _data((3, 300), seed=5)
    packed = layout.empty(x.device)
    layout.quantize_into(x, packed)
    q, scales = quantize_blocks(x, 100)
    assert torch.equal(layout.payload(packed), q) and torch.equal(layout.scales(packed), scales)
    out = torch.empty(300)
    layout.dequantize_row(packed, 2, out, accumulate=False)
    assert torch.equal(out, dequantize_blocks(q[2], scales[2], 100))


# -- registration and dispatch --------------------------------------------------------------


def test_the_plugin_collectives_are_listed_with_their_provider() -> None:
    listed = torchcomms.list_collectives()
    for name in ("quantized_all_reduce", "quantized_reduce_scatter"):
        assert listed[name].startswith("torchcomms-quantized "), listed[name]
    assert "A_b / 126" in TorchComm.quantized_all_reduce.__doc__


def test_quantized_all_reduce_runs_pre_and_post_hooks_under_its_own_name() -> None:
    comms = _group(2)
    events: list[tuple[str, str, object]] = []
    lock = threading.Lock()

    def pre(name, op_id, args):
        with lock:
            events.append(("pre", str(name), args.op))

    def post(op_id, args):
        with lock:
            events.append(("post", args.op_name, isinstance(args.work, TorchWork)))

    for comm in comms:
        comm.register_pre_hook(pre)
        comm.register_post_hook(post)
    run_threads(comms, lambda c: c.quantized_all_reduce(torch.ones(1000), ReduceOp.AVG))
    assert sorted(events, key=str) == sorted(
        [("pre", "quantized_all_reduce", ReduceOp.AVG)] * 2
        + [("post", "quantized_all_reduce", True)] * 2,
        key=str,
    )


class _NativeQuantizedBackend(MemoryBackend):
    """A backend with its own quantized_all_reduce, which the core must call instead."""

    def __init__(self, fabric: _Fabric | None = None, rank: int = 0) -> None:
        super().__init__(fabric, rank)
        self.calls: list[tuple] = []

    def quantized_all_reduce(
        self, tensor, op, async_op, *, timeout=None, hints=None, block_size, dtype
    ):
        self.calls.append((op, async_op, block_size, dtype))
        tensor.fill_(42.0)
        return None


def test_a_backends_native_quantized_all_reduce_replaces_the_portable_one() -> None:
    comm = _group(2, _NativeQuantizedBackend)[0]
    t = torch.ones(10)
    # Only rank 0 calls: the portable version would wait for rank 1 and time out.
    work = comm.quantized_all_reduce(t, block_size=64)
    backend = comm.get_backend_impl()
    assert work.is_completed() and torch.equal(t, torch.full((10,), 42.0))
    assert backend.calls == [(ReduceOp.SUM, False, 64, torch.int8)]
    assert backend.sent_bytes == 0


class _DuplicatePlugin:
    @hookimpl
    def torchcomms_register_collectives(self) -> list[Collective]:
        return [
            Collective(name="quantized_all_reduce", impl=lambda *a, **k: None, args=("tensor",))
        ]


def test_a_second_plugin_with_the_same_collective_name_is_refused_naming_both() -> None:
    try:
        with pytest.raises(PluginError) as info:
            torchcomms.register_plugin(
                _DuplicatePlugin(), name="quantized-fork", provider="quantized-fork 9.9"
            )
    finally:
        torchcomms.unregister_plugin("quantized-fork")
    message = str(info.value)
    assert "'quantized_all_reduce'" in message
    assert "torchcomms-quantized" in message and "quantized-fork 9.9" in message
    assert torchcomms.list_collectives()["quantized_all_reduce"].startswith("torchcomms-quantized")


# -- validation --------------------------------------------------------------------------


def _bad_calls() -> list:
    f = torch.ones(8)
    return [
        (
            lambda c: c.quantized_all_reduce(torch.ones(8, dtype=torch.int32)),
            CommInputError,
            "quantized_all_reduce: tensor has dtype int32, but only float32, bfloat16 and "
            "float16 tensors can be quantized",
        ),
        (
            lambda c: c.quantized_all_reduce(f, ReduceOp.MAX),
            CommInputError,
            "op must be ReduceOp.SUM or ReduceOp.AVG, got ReduceOp.MAX",
        ),
        (
            lambda c: c.quantized_all_reduce(f, ReduceOp.PREMUL_SUM(2.0)),
            CommInputError,
            "got ReduceOp.PREMUL_SUM",
        ),
        (
            lambda c: c.quantized_all_reduce(f, block_size=0),
            CommInputError,
            "block_size must be a positive int, got 0",
        ),
        (
            lambda c: c.quantized_all_reduce(f, block_size=2.5),
            CommTypeError,
            "block_size must be a positive int, got 2.5 (float)",
        ),
        (
            lambda c: c.quantized_all_reduce(f, block_size=True),
            CommTypeError,
            "block_size must be a positive int, got True",
        ),
        (
            lambda c: c.quantized_all_reduce(f, dtype=torch.uint8),
            CommInputError,
            "dtype must be torch.int8, the only quantized type supported, got torch.uint8",
        ),
        (
            lambda c: c.quantized_all_reduce(f, blocksize=128),
            CommTypeError,
            "unexpected keyword argument(s) 'blocksize'",
        ),
        (
            lambda c: c.quantized_all_reduce(torch.ones(8, device="meta")),
            CommInputError,
            "tensor is on device meta",
        ),
        (
            lambda c: c.quantized_reduce_scatter(torch.ones(4), torch.ones(10)),
            CommInputError,
            "input has 10 elements (shape (10,)) but must have 8 (output.numel() * size = 4 * 2)",
        ),
        (
            lambda c: c.quantized_reduce_scatter(torch.ones(4), torch.ones(8, dtype=torch.float16)),
            CommInputError,
            "output has dtype float32 but input has dtype float16",
        ),
    ]


@pytest.mark.parametrize("index", range(len(_bad_calls())))
def test_bad_arguments_are_refused_before_any_communication(index: int) -> None:
    call, error, message = _bad_calls()[index]
    comm = _group(2)[0]  # rank 1 never takes part: any communication would time out
    with pytest.raises(error) as info:
        call(comm)
    assert message in str(info.value)
    assert comm.get_backend_impl().sent_bytes == 0


# -- results on the in-process backend ---------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "shape", "block_size"),
    [
        (1, (1000,), 256),
        (3, (37, 29), 256),
        (3, (5000,), 7),
        (4, (0,), 256),
    ],
)
def test_odd_sizes_and_world_sizes_stay_within_the_bound(
    size: int, shape: tuple[int, ...], block_size: int
) -> None:
    comms = _group(size)
    inputs = [_data(shape, seed=10 + r) if shape[0] else torch.ones(shape) for r in range(size)]
    # A transposed view: the collective must accept non-contiguous tensors.
    tensors = [x.t().clone().t() if x.dim() == 2 else x.clone() for x in inputs]
    run_threads(
        comms, lambda c: c.quantized_all_reduce(tensors[c.get_rank()], block_size=block_size)
    )
    exact = sum(x.double() for x in inputs)
    absmax = sum(all_reduce_block_absmax(x, size, block_size) for x in inputs)
    bound = all_reduce_error_bound(absmax, exact, ReduceOp.SUM, size, torch.float32, block_size)
    for t in tensors:
        assert bool(((t.double() - exact).abs() <= bound).all())
        assert torch.equal(t, tensors[0])


def test_wire_bytes_are_at_most_27_percent_of_a_float32_all_reduce() -> None:
    n, numel = 4, 1 << 20
    comms = _group(n)
    inputs = [torch.randn(numel) for _ in range(n)]
    run_threads(comms, lambda c: c.quantized_all_reduce(inputs[c.get_rank()].clone()))
    quantized = [c.get_backend_impl().sent_bytes for c in comms]

    fp32 = _group(n)

    def exact_all_reduce(c: TorchComm) -> None:
        chunk = torch.empty(numel // n)
        c.reduce_scatter_single(chunk, inputs[c.get_rank()].clone(), ReduceOp.SUM)
        c.all_gather_single(torch.empty(numel), chunk)

    run_threads(fp32, exact_all_reduce)
    reference = [c.get_backend_impl().sent_bytes for c in fp32]
    theoretical = 2 * (n - 1) / n * 4 * numel
    assert reference == [theoretical] * n
    for sent in quantized:
        assert sent <= 0.27 * theoretical
        assert math.isclose(sent / theoretical, (1 + 4 / 256) / 4)


def test_async_quantized_reduce_scatter_returns_before_the_peer_has_sent() -> None:
    comms = _group(2)
    inputs = [_data((2, 3000), seed=20 + r) for r in range(2)]
    outputs = [torch.empty(3000) for _ in range(2)]
    issued = threading.Event()
    seen: dict[str, bool] = {}

    def body(c: TorchComm) -> None:
        r = c.get_rank()
        if r == 0:
            work = c.quantized_reduce_scatter(outputs[0], inputs[0], ReduceOp.SUM, True)
            seen["pending"] = not work.is_completed()
            issued.set()
            work.wait()
        else:
            assert issued.wait(10)
            c.quantized_reduce_scatter(outputs[1], inputs[1], ReduceOp.SUM)

    run_threads(comms, body)
    assert seen["pending"]
    exact = (inputs[0].double() + inputs[1].double()).view(2, 3000)
    absmax = sum(reduce_scatter_block_absmax(x, 2) for x in inputs)
    for r in range(2):
        bound = reduce_scatter_error_bound(absmax[r], exact[r], ReduceOp.SUM, 2, torch.float32)
        assert bool(((outputs[r].double() - exact[r]).abs() <= bound).all())


def test_the_bench_check_accepts_results_within_the_bound_and_flags_others() -> None:
    from torchcomms_core.bench.ops import Case, available_ops

    op = available_ops()["quantized_all_reduce"]
    comms = _group(2)
    cases = [
        Case(rank=r, nranks=2, dtype=torch.bfloat16, device=torch.device("cpu"), redop="avg")
        for r in range(2)
    ]
    count = op.count(3000, cases[0])
    bufs = [op.allocate(count, case) for case in cases]
    for case, buf in zip(cases, bufs, strict=True):
        op.fill(buf, case)
    run_threads(comms, lambda c: op.run(c, bufs[c.get_rank()], cases[c.get_rank()]))
    assert [op.count_wrong(b, c) for b, c in zip(bufs, cases, strict=True)] == [0, 0]
    bufs[0].output[7] += 10.0
    assert op.count_wrong(bufs[0], cases[0]) == 1


# -- over real gloo ranks --------------------------------------------------------------------


def _gloo_comm() -> TorchComm:
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("quantized"))


def _same_bits_everywhere(comm: TorchComm, t: torch.Tensor) -> bool:
    n = comm.get_size()
    gathered = torch.empty(n * t.numel(), dtype=t.dtype)
    comm.all_gather_single(gathered, t.reshape(-1))
    raw = gathered.view(n, -1).view(torch.uint8)
    return all(torch.equal(raw[i], raw[0]) for i in range(1, n))


def body_all_reduce_error(dtype_name: str) -> list[dict]:
    comm = _gloo_comm()
    n, r = comm.get_size(), comm.get_rank()
    dtype = getattr(torch, dtype_name)
    report = []
    for op in (ReduceOp.SUM, ReduceOp.AVG):
        for block_size in (256, 100):
            x = _data((333, 301), seed=100 * n + r, dtype=dtype)
            exact = x.to(torch.float64)
            comm.all_reduce(exact, op)  # float64: exact for these few float32 addends
            absmax = all_reduce_block_absmax(x, n, block_size)
            comm.all_reduce(absmax, ReduceOp.SUM)
            bound = all_reduce_error_bound(absmax, exact, op, n, dtype, block_size)
            t = x.clone()
            comm.quantized_all_reduce(t, op, block_size=block_size)
            error = (t.to(torch.float64) - exact).abs()
            report.append(
                {
                    "op": repr(op),
                    "block_size": block_size,
                    "within": bool((error <= bound).all()),
                    "worst_ratio": float((error / bound).max()),
                    "max_error": float(error.max()),
                    "max_bound": float(bound.max()),
                    "identical": _same_bits_everywhere(comm, t),
                }
            )
    comm.finalize()
    return report


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16", "float16"])
def test_quantized_all_reduce_is_within_the_bound_and_bit_identical_on_every_rank(
    pool, dtype_name: str
) -> None:
    for rank, report in enumerate(pool.run(body_all_reduce_error, dtype_name)):
        for entry in report:
            assert entry["within"], (rank, entry)
            assert entry["identical"], (rank, entry)
            # Quantization really happened (the error is not trivially zero).
            assert entry["worst_ratio"] > 0.01, (rank, entry)


def body_reduce_scatter_error() -> list[tuple[bool, float]]:
    comm = _gloo_comm()
    n, r = comm.get_size(), comm.get_rank()
    chunk = 10007
    results = []
    for op in (ReduceOp.SUM, ReduceOp.AVG):
        x = _data((n, chunk), seed=300 + r)
        full = x.to(torch.float64)
        comm.all_reduce(full, op)
        exact = full[r]
        absmax = reduce_scatter_block_absmax(x, n)
        comm.all_reduce(absmax, ReduceOp.SUM)
        bound = reduce_scatter_error_bound(absmax[r], exact, op, n, torch.float32)
        out = torch.empty(chunk)
        comm.quantized_reduce_scatter(out, x, op)
        error = (out.to(torch.float64) - exact).abs()
        results.append((bool((error <= bound).all()), float((error / bound).max())))
    comm.finalize()
    return results


def test_quantized_reduce_scatter_is_within_its_bound(pool) -> None:
    for rank_results in pool.run(body_reduce_scatter_error):
        for within, worst in rank_results:
            assert within and worst > 0.01, rank_results


def body_async_matches_sync() -> tuple[bool, bool, bool]:
    comm = _gloo_comm()
    n, r = comm.get_size(), comm.get_rank()
    x = _data((4096,), seed=500 + r, dtype=torch.bfloat16)
    sync = x.clone()
    comm.quantized_all_reduce(sync, ReduceOp.SUM)
    later = x.clone()
    work = comm.quantized_all_reduce(later, ReduceOp.SUM, True)
    is_work = isinstance(work, TorchWork)
    work.wait()
    rs_sync, rs_async = torch.empty(4096 // n, dtype=x.dtype), torch.empty(4096 // n, dtype=x.dtype)
    comm.quantized_reduce_scatter(rs_sync, x)
    comm.quantized_reduce_scatter(rs_async, x, async_op=True).wait()
    comm.finalize()
    return is_work, torch.equal(sync, later), torch.equal(rs_sync, rs_async)


def test_async_op_returns_a_work_whose_result_equals_the_synchronous_one(pool2) -> None:
    assert pool2.run(body_async_matches_sync) == [(True, True, True)] * 2


# -- GPU: fused CuPy kernels and CUDA against CPU --------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _cupy_kernels_available() -> bool:
    if not torch.cuda.is_available():
        return False
    from torchcomms_quantized import cuda_kernels

    return cuda_kernels.available()


@pytest.mark.gpu
@needs_cuda
def test_fused_kernels_give_the_same_bits_as_torch_ops_on_cuda() -> None:
    if not _cupy_kernels_available():
        pytest.skip("CuPy kernels unavailable (pip install torchcomms-quantized[cuda])")
    x = _data((37, 1024), seed=600).cuda()
    x[3, :256] = 0.0
    x[4, :256] = FLUSH_BELOW / 8
    for block_size in (256, 100, 1024):
        cols = 1024 - 1024 % block_size
        xs = x[:, :cols]
        q_fused, s_fused = quantize_blocks(xs, block_size, fused=True)
        q_torch, s_torch = quantize_blocks(xs, block_size, fused=False)
        assert torch.equal(q_fused, q_torch) and torch.equal(s_fused, s_torch)
        out_fused = dequantize_blocks(q_fused, s_fused, block_size, fused=True)
        out_torch = dequantize_blocks(q_torch, s_torch, block_size, fused=False)
        assert torch.equal(out_fused, out_torch)
        dequantize_blocks(q_fused, s_fused, block_size, out=out_fused, accumulate=True, fused=True)
        dequantize_blocks(q_torch, s_torch, block_size, out=out_torch, accumulate=True, fused=False)
        assert torch.equal(out_fused, out_torch)
    # Strided outputs: the packed wire layout.
    layout = Layout(rows=4, cols=768, block_size=256)
    fused_packed, torch_packed = layout.empty(x.device), layout.empty(x.device)
    quantize_blocks(
        x[:4, :768],
        256,
        q_out=layout.payload(fused_packed),
        scales_out=layout.scales(fused_packed),
        fused=True,
    )
    quantize_blocks(
        x[:4, :768],
        256,
        q_out=layout.payload(torch_packed),
        scales_out=layout.scales(torch_packed),
        fused=False,
    )
    assert torch.equal(fused_packed, torch_packed)


@pytest.mark.gpu
@needs_cuda
def test_cuda_quantization_gives_the_same_bits_as_cpu() -> None:
    x = _data((16, 1024), seed=700)
    q_cpu, s_cpu = quantize_blocks(x, 256)
    q_gpu, s_gpu = quantize_blocks(x.cuda(), 256)
    assert torch.equal(q_gpu.cpu(), q_cpu) and torch.equal(s_gpu.cpu(), s_cpu)
    assert torch.equal(
        dequantize_blocks(q_gpu, s_gpu, 256).cpu(), dequantize_blocks(q_cpu, s_cpu, 256)
    )


@pytest.mark.gpu
@needs_cuda
def test_quantized_all_reduce_on_cuda_matches_cpu_within_the_bound() -> None:
    n = 2
    inputs = [_data((100, 777), seed=800 + r, dtype=torch.bfloat16) for r in range(n)]
    results = {}
    for device in (torch.device("cpu"), torch.device("cuda", torch.cuda.current_device())):
        comms = _group(n, device=device)
        tensors = [x.to(device) for x in inputs]

        def body(c: TorchComm, tensors: list[torch.Tensor] = tensors) -> None:
            c.quantized_all_reduce(tensors[c.get_rank()], ReduceOp.AVG)

        run_threads(comms, body)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        results[device.type] = [t.cpu() for t in tensors]
    exact = sum(x.double() for x in inputs) / n
    absmax = sum(all_reduce_block_absmax(x, n) for x in inputs)
    bound = all_reduce_error_bound(absmax, exact, ReduceOp.AVG, n, torch.bfloat16)
    for t in results["cuda"] + results["cpu"]:
        assert bool(((t.double() - exact).abs() <= bound).all())
    assert torch.equal(results["cuda"][0], results["cuda"][1])
    assert torch.equal(results["cuda"][0], results["cpu"][0])

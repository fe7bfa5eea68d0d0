"""The int8 hop between hosts (hint ``global_codec``) and the small-message algorithms, on
live ranks: every element against the documented bound, the levels that carried the data,
and what a missing quantized plugin says.

Hosts are simulated with the hint ``host_id`` (four ranks: two hosts of two, or 3 + 1).
"""

from __future__ import annotations

import hashlib
import random
import time
from typing import Any

import pytest
import torch

import torchcomms
from torchcomms_core.testing import RankPool, current_rank, unique_name

#: Host of each rank, by layout.
LAYOUTS = {"2x2": "aabb", "3+1": "aaab", "4x1": "abcd", "3x1+1": "abcc"}


def _hier(layout: str, **hints: str) -> Any:
    host = LAYOUTS[layout][current_rank()]
    every = {"host_id": host, "local_backend": "gloo", **hints}
    return torchcomms.new_comm("hier", "cpu", name=unique_name("hier"), hints=every)


def _inputs(n: int, count: int, seed: int) -> list[torch.Tensor]:
    """Every rank's input, the same on every rank: blocks of very different magnitudes
    (large, tiny, all zero, one outlier) so the per-block scales matter."""
    out = []
    for r in range(n):
        gen = torch.Generator().manual_seed(seed + r)
        x = torch.randn(count, generator=gen, dtype=torch.float64)
        scale = torch.logspace(-6, 4, steps=max(1, -(-count // 256)), dtype=torch.float64)
        x *= scale.repeat_interleave(256)[:count]
        x[: min(count, 300)] *= 1e3  # a large first block (and a piece of the second)
        if count > 1024:
            x[512:768] = 0.0  # an all-zero block
            x[900] = 5e5 * (r + 1)  # an outlier inside a small block
        out.append(x.to(torch.float32))
    return out


def _ops_seen(level: Any) -> list[str]:
    seen: list[str] = []
    level.register_pre_hook(lambda name, op_id, args: seen.append(str(name).rsplit(".", 1)[-1]))
    return seen


def body_codec_all_reduce(layout: str, count: int, dtype_name: str) -> dict[str, Any]:
    from torchcomms_hier import global_codec_error_bound

    dtype = getattr(torch, dtype_name)
    comm = _hier(layout, global_codec="int8")
    r, n = comm.get_rank(), comm.get_size()
    levels = comm.get_backend_impl().levels()
    cross = levels.get("rail") or levels.get("leaders")
    cross_ops = _ops_seen(cross) if cross is not None else []
    inputs = [x.to(dtype) for x in _inputs(n, count, 7)]
    t = inputs[r].clone()
    comm.all_reduce(t, torchcomms.ReduceOp.SUM)
    bound = global_codec_error_bound(inputs, torchcomms.ReduceOp.SUM, dtype=dtype)
    exact = torch.stack([x.double() for x in inputs]).sum(0)
    error = (t.double() - exact).abs()
    outside = int((~(error <= bound)).sum())
    avg = inputs[r].clone()
    comm.all_reduce(avg, torchcomms.ReduceOp.AVG)
    avg_bound = global_codec_error_bound(inputs, torchcomms.ReduceOp.AVG, dtype=dtype)
    outside_avg = int((~((avg.double() - exact / n).abs() <= avg_bound)).sum())
    # Integers and MAX stay exact with the codec on.
    ints = torch.arange(count, dtype=torch.int32) * (r + 1)
    comm.all_reduce(ints, torchcomms.ReduceOp.SUM)
    mx = inputs[r].clone()
    comm.all_reduce(mx, torchcomms.ReduceOp.MAX)
    comm.finalize()
    return {
        "outside": outside,
        "outside_avg": outside_avg,
        "max_error": float(error.max()),
        "digest": hashlib.sha256(t.view(-1).view(torch.uint8).numpy().tobytes()).hexdigest(),
        "cross_ops": cross_ops,
        "ints_exact": bool(torch.equal(ints, torch.arange(count, dtype=torch.int32) * 10)),
        "max_exact": bool(torch.equal(mx, torch.stack(inputs).amax(0))),
    }


@pytest.mark.parametrize(
    ("layout", "count", "dtype_name"),
    [
        ("2x2", (4 << 20) + 5, "float32"),  # pipelined, 8 pieces, a ragged end
        ("2x2", 3000, "float32"),  # below hier::rs_min_bytes: local reduce, rail 0
        ("3+1", (1 << 20) + 77, "float32"),  # uneven: the leaders' hop
        ("2x2", (1 << 19) + 1, "bfloat16"),
    ],
)
def test_codec_all_reduce_is_within_the_bound_everywhere(
    pool4: RankPool, layout: str, count: int, dtype_name: str
) -> None:
    results = pool4.run(body_codec_all_reduce, layout, count, dtype_name, timeout=300)
    for r, res in enumerate(results):
        assert res["outside"] == 0, (r, res["outside"], res["max_error"])
        assert res["outside_avg"] == 0, (r, res["outside_avg"])
        assert res["max_error"] > 0, "the result is exact: the hop did not quantize"
        assert res["ints_exact"] and res["max_exact"]
        # The hop between hosts ran the quantized collective, on the level between hosts.
        leader = LAYOUTS[layout].index(LAYOUTS[layout][r]) == r  # local rank 0
        if leader or (layout == "2x2" and count * 4 >= 64 << 10):  # pipelined: every rail
            assert "quantized_all_reduce" in res["cross_ops"], res["cross_ops"]
            assert "all_reduce" not in res["cross_ops"][:2]
    # Every rank holds the same bits.
    assert all(res["digest"] == results[0]["digest"] for res in results)


def body_codec_reduce_scatter(layout: str, count: int) -> dict[str, Any]:
    from torchcomms_hier import global_codec_reduce_scatter_error_bound

    comm = _hier(layout, global_codec="int8")
    r, n = comm.get_rank(), comm.get_size()
    inputs = _inputs(n, n * count, 99)
    out = torch.empty(count)
    comm.reduce_scatter_single(out, inputs[r], torchcomms.ReduceOp.SUM)
    bound = global_codec_reduce_scatter_error_bound(inputs, r, torchcomms.ReduceOp.SUM)
    exact = torch.stack([x.double() for x in inputs]).sum(0)[r * count : (r + 1) * count]
    error = (out.double() - exact).abs()
    # quantized_reduce_scatter through hier takes the same path; AVG divides at the end.
    q = torch.empty(count)
    comm.quantized_reduce_scatter(q, inputs[r], torchcomms.ReduceOp.AVG)
    avg_bound = global_codec_reduce_scatter_error_bound(inputs, r, torchcomms.ReduceOp.AVG)
    comm.finalize()
    return {
        "outside": int((~(error <= bound)).sum()),
        "max_error": float(error.max()),
        "outside_q": int((~((q.double() - exact / n).abs() <= avg_bound)).sum()),
    }


@pytest.mark.parametrize(("layout", "count"), [("2x2", (1 << 18) + 3), ("3+1", 70000)])
def test_codec_reduce_scatter_is_within_the_bound(pool4: RankPool, layout: str, count: int) -> None:
    for r, res in enumerate(pool4.run(body_codec_reduce_scatter, layout, count, timeout=300)):
        assert res["outside"] == 0 and res["outside_q"] == 0, (r, res)
        assert res["max_error"] > 0, "the result is exact: the hop did not quantize"


def body_quantized_all_reduce_on_hier(layout: str, count: int) -> dict[str, Any]:
    from torchcomms_hier import global_codec_error_bound

    comm = _hier(layout)  # no codec hint: quantized_all_reduce picks the int8 hop itself
    r, n = comm.get_rank(), comm.get_size()
    levels = comm.get_backend_impl().levels()
    local_ops = _ops_seen(levels["local"])
    cross = levels.get("rail") or levels.get("leaders")
    cross_ops = _ops_seen(cross) if cross is not None else []
    global_ops = _ops_seen(levels["global"])
    inputs = _inputs(n, count, 5)
    t = inputs[r].clone()
    comm.quantized_all_reduce(t, torchcomms.ReduceOp.SUM)
    bound = global_codec_error_bound(inputs)
    exact = torch.stack([x.double() for x in inputs]).sum(0)
    plain = inputs[r].clone()
    comm.all_reduce(plain, torchcomms.ReduceOp.SUM)  # no hint: exact
    comm.finalize()
    return {
        "outside": int((~((t.double() - exact).abs() <= bound)).sum()),
        "local_ops": local_ops,
        "cross_ops": cross_ops,
        "global_ops": global_ops,
        "plain_close": bool(torch.allclose(plain.double(), exact, rtol=1e-5, atol=1e-2)),
    }


def test_quantized_all_reduce_on_hier_quantizes_between_hosts_only(pool4: RankPool) -> None:
    for r, res in enumerate(pool4.run(body_quantized_all_reduce_on_hier, "2x2", 1 << 20)):
        assert res["outside"] == 0, (r, res["outside"])
        # Exact inside the host (reduce_scatter, all_gather), int8 on the rail only; the
        # flat quantized collective would have run all_to_all on the global level.
        assert res["local_ops"][:2] == ["reduce_scatter_single", "all_gather_single"], res
        assert "quantized_all_reduce" in res["cross_ops"], res["cross_ops"]
        assert "all_to_all_single" not in res["global_ops"], res["global_ops"]
        assert res["plain_close"]


def body_codec_settings(which: str) -> tuple[str, str]:
    """``which``: a codec (``int8``, ``none``), ``unknown``, or ``differ`` (rank 3 names
    none, the others int8)."""
    r = current_rank()
    codec = {"unknown": "int3", "differ": "none" if r == 3 else "int8"}.get(which, which)
    hints = {"host_id": LAYOUTS["2x2"][r], "local_backend": "gloo", "global_codec": codec}
    try:
        comm = torchcomms.new_comm("hier", "cpu", name=unique_name("codec"), hints=hints)
    except torchcomms.TorchCommError as exc:
        return type(exc).__name__, str(exc)
    t = torch.ones(4)
    comm.all_reduce(t, torchcomms.ReduceOp.SUM)
    comm.finalize()
    return "created", str(float(t[0]))


def test_unknown_or_differing_codec_is_an_input_error_on_every_rank(pool4: RankPool) -> None:
    for kind, message in pool4.run(body_codec_settings, "unknown", timeout=60):
        assert kind == "CommInputError" and "int3" in message and "int8" in message, message
    for kind, message in pool4.run(body_codec_settings, "differ", timeout=60):
        assert kind == "CommInputError" and "global_codec differs" in message, message


def test_codec_without_the_quantized_plugin_names_what_to_install() -> None:
    # Host b's processes load no plugins, as if torchcomms-quantized were not installed.
    off = {"TORCHCOMM_DISABLE_PLUGIN_AUTOLOAD": "1"}
    with RankPool(4, rank_env={2: off, 3: off}) as pool:
        results = pool.run(body_codec_settings, "int8", timeout=60)
        plain = pool.run(body_codec_settings, "none", timeout=60)
    for r, (kind, message) in enumerate(results):
        if r >= 2:
            assert kind == "CommInputError", message
            assert "pip install torchcomms-hier[int8]" in message, message
        else:
            assert kind == "CommOperationError", message
            assert "host 'b'" in message and "torchcomms-quantized" in message, message
    assert plain == [("created", "4.0")] * 4  # without the hint nothing needs the plugin


# -- small messages: recursive doubling between hosts --------------------------------------


def body_small(layout: str, algorithm: str, dtype_name: str) -> dict[str, Any]:
    comm = _hier(layout, **{"hier::all_reduce_algorithm": algorithm})
    r = comm.get_rank()
    dtype = getattr(torch, dtype_name)
    levels = comm.get_backend_impl().levels()
    cross = levels.get("rail") or levels.get("leaders")
    cross_ops = _ops_seen(cross) if cross is not None else []
    results = {}
    for op in ("SUM", "MAX", "MIN", "PRODUCT"):
        t = (torch.arange(7, dtype=torch.float64) * 0.1 + r + 1).to(dtype)
        comm.all_reduce(t, getattr(torchcomms.ReduceOp, op))
        results[op] = t.tolist()
    xs = torch.tensor([1 << r, 3 * r], dtype=torch.int64)
    comm.all_reduce(xs, torchcomms.ReduceOp.BXOR)
    results["BXOR"] = xs.tolist()
    comm.finalize()
    return {"results": results, "cross_ops": cross_ops}


@pytest.mark.parametrize(
    ("layout", "algorithm"),
    [("4x1", "recursive_doubling"), ("3x1+1", "recursive_doubling"), ("3+1", "auto")],
)
def test_recursive_doubling_is_exact_and_identical_on_every_rank(
    pool4: RankPool, layout: str, algorithm: str
) -> None:
    results = pool4.run(body_small, layout, algorithm, "float64", timeout=120)
    n = 4
    base = [[k * 0.1 + r + 1 for k in range(7)] for r in range(n)]
    expected_sum = [sum(b[k] for b in base) for k in range(7)]
    for res in results:
        assert res["results"] == results[0]["results"]  # bit-identical
        got = res["results"]
        assert got["MAX"] == base[-1] and got["MIN"] == base[0]
        assert got["SUM"] == pytest.approx(expected_sum, rel=1e-12)
        assert got["BXOR"] == [1 ^ 2 ^ 4 ^ 8, 0 ^ 3 ^ 6 ^ 9]
    if algorithm == "recursive_doubling":
        # Between hosts only point-to-point ran: no all_reduce on the level.
        leaders = [res["cross_ops"] for res in results if res["cross_ops"]]
        assert leaders and all("all_reduce" not in ops for ops in leaders), leaders
        assert any("send" in ops and "recv" in ops for ops in leaders), leaders


def body_back_to_back(layout: str, calls: int) -> list[list[int]]:
    comm = _hier(layout, **{"hier::all_reduce_algorithm": "recursive_doubling"})
    r = comm.get_rank()
    rng = random.Random(r)
    out = []
    for i in range(calls):
        if rng.random() < 0.2:  # a rank that falls behind: the others' next messages wait
            time.sleep(rng.random() * 0.01)
        t = torch.tensor([i * 1000 + r, (i + r) % 7], dtype=torch.int64)
        comm.all_reduce(t, torchcomms.ReduceOp.SUM)
        out.append(t.tolist())
    comm.finalize()
    return out


@pytest.mark.parametrize("layout", ["4x1", "3x1+1"])
def test_recursive_doubling_back_to_back_calls_each_get_their_own_sum(
    pool4: RankPool, layout: str
) -> None:
    """Receives are posted a whole call ahead: a rank running ahead or behind must never
    let one call's message complete another call's receive."""
    calls = 60
    results = pool4.run(body_back_to_back, layout, calls, timeout=120)
    n = 4
    for i in range(calls):
        expected = [sum(i * 1000 + r for r in range(n)), sum((i + r) % 7 for r in range(n))]
        for res in results:
            assert res[i] == expected, (i, res[i], expected)


def test_the_size_rule_and_the_forcing_hint() -> None:
    from torchcomms_hier import choose_all_reduce
    from torchcomms_hier.algorithms import RD_MIN_HOSTS, AllReduceRule, parse_algorithm

    rule = AllReduceRule(4096, 65536, None)
    assert RD_MIN_HOSTS == 2
    # Small messages: recursive doubling between hosts, whatever the ranks per host.
    for nhosts, local_size in ((2, 1), (3, 1), (8, 2), (4, 3)):
        assert choose_all_reduce(8, 2, nhosts, local_size, True, rule) == "recursive_doubling"
        assert choose_all_reduce(4096, 1024, nhosts, local_size, True, rule) == (
            "recursive_doubling"
        )
    none_small = AllReduceRule(0, 65536, None)  # hier::flat_max_bytes=0
    assert choose_all_reduce(8, 2, 8, 1, True, none_small) == "levels"
    flat = AllReduceRule(4096, 65536, parse_algorithm("flat"))
    assert choose_all_reduce(8, 2, 8, 1, True, flat) == "flat"
    rd = AllReduceRule(4096, 65536, parse_algorithm("recursive_doubling"))
    assert choose_all_reduce(8, 2, 8, 1, True, rd) == "recursive_doubling"
    assert choose_all_reduce(4097, 1025, 2, 2, True, rule) == "levels"
    assert choose_all_reduce(1 << 20, 1 << 18, 8, 2, True, rule) == "pipelined"
    assert choose_all_reduce(1 << 20, 1 << 18, 3, 2, False, rule) == "levels"
    forced = AllReduceRule(4096, 65536, "pipelined")
    assert choose_all_reduce(8, 2, 2, 2, False, forced) == "levels"  # cannot pipeline
    with pytest.raises(torchcomms.CommInputError, match="recursive_doubling"):
        parse_algorithm("tree")

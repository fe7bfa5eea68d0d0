"""Plugin collectives bring their benchmarks: ``Collective(bench=...)``.

``torchcomms bench`` offers exactly the installed collectives that declare one: their
names appear in ``--help`` and ``--ops`` accepts them only while the plugin is loaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

import torchcomms
from torchcomms import Collective, ReduceOp, hookimpl
from torchcomms_core.bench.ops import available_ops, unknown_ops_message
from torchcomms_core.plugin import bench


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TORCHCOMM_")}
    return subprocess.run(
        [sys.executable, "-m", "torchcomms_core.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**clean, **env},
        cwd="/",
    )


def test_bench_help_and_ops_follow_what_is_installed() -> None:
    res = _cli("bench", "--help")
    assert res.returncode == 0, res.stderr
    assert "quantized_all_reduce" in res.stdout and "quantized_reduce_scatter" in res.stdout
    # Only the built-in plugin loaded: the quantized collectives are not installed.
    res = _cli("bench", "--help", TORCHCOMM_PLUGINS="none")
    assert res.returncode == 0, res.stderr
    assert "quantized_all_reduce" not in res.stdout and "quantized_reduce_scatter" not in res.stdout
    assert "all_reduce_coalesced" in res.stdout
    res = _cli("bench", "--ops", "quantized_all_reduce", TORCHCOMM_PLUGINS="none")
    assert res.returncode == 2
    assert "unknown operation 'quantized_all_reduce'" in res.stderr
    assert "offered once its plugin is installed" in res.stderr


def _sum(backend, tensor, op, async_op, *, timeout=None, hints=None):
    return backend.all_reduce(tensor, op, async_op, timeout=timeout, hints=hints)


class TwiceSum(bench.PluginOp, bench.AllReduce):
    """all_reduce under another name: the exact result of all_reduce."""

    name = "bench_twice_sum"

    def run(self, comm, bufs, case):
        comm.bench_twice_sum(bufs.output, case.reduce_op)


class Benched:
    """Collectives with a good benchmark, none, and broken ones."""

    @hookimpl
    def torchcomms_register_collectives(self) -> list[Collective]:
        def coll(name: str, bench_: object) -> Collective:
            defaults = {"op": ReduceOp.SUM}
            return Collective(
                name=name, impl=_sum, args=("tensor", "op"), defaults=defaults, bench=bench_
            )

        return [
            coll("bench_twice_sum", "test_plugin_bench:TwiceSum"),
            coll("bench_none_sum", None),
            coll("bench_misnamed_sum", TwiceSum()),
            coll("bench_missing_sum", "test_plugin_bench:NoSuchClass"),
        ]


@pytest.fixture
def benched():
    torchcomms.register_plugin(Benched(), name="benched", provider="tc-benched 2.0")
    try:
        yield
    finally:
        torchcomms.unregister_plugin("benched")


def test_a_plugin_collective_declares_its_benchmark(benched) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ops = available_ops()
        ok = unknown_ops_message(["bench_twice_sum"])
        message = unknown_ops_message(["bench_none_sum"])
    assert isinstance(ops["bench_twice_sum"], TwiceSum)
    assert "bench_none_sum" not in ops
    messages = [str(w.message) for w in caught]
    assert any(
        "'bench_misnamed_sum' from tc-benched 2.0" in m and "named 'bench_twice_sum'" in m
        for m in messages
    ), messages
    assert any("'bench_missing_sum'" in m and "NoSuchClass" in m for m in messages), messages
    assert ok is None
    assert message is not None and "declares no benchmark" in message
    assert "tc-benched 2.0" in message and "Collective(bench=...)" in message
    # method_support lists plugin collectives: the backend has none of them natively.
    support = torchcomms.method_support(torchcomms.get_backend_class("gloo"))
    assert support["bench_twice_sum"] == "derived"
    assert support["quantized_all_reduce"] == "derived"


def test_a_bench_that_is_not_a_benchmark_is_refused() -> None:
    with pytest.raises(torchcomms.CommTypeError, match="bench must be a BenchOp"):
        Collective(name="bad_bench", impl=_sum, args=("tensor",), bench=42)

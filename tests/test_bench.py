"""Tests of ``torchcomms bench``: the size parser, option errors, the result check and a run.

The end-to-end test launches two real gloo ranks; the others run in this process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import torch

from torchcomms_core import _env
from torchcomms_core.bench import launch as launch_module
from torchcomms_core.bench.launch import launch
from torchcomms_core.bench.ops import OPS, Buffers, Case
from torchcomms_core.bench.sizes import parse_size, size_sweep
from torchcomms_core.cli import main

# -- sizes -----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("8", 8), ("64K", 64 << 10), ("1M", 1 << 20), ("2G", 2 << 30), ("64k", 64 << 10),
])
def test_parse_size_reads_binary_suffixes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["12X", "", "1.5M", "-1", "M", "0"])
def test_parse_size_rejects_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_a_bad_size_is_an_argparse_error_naming_the_option(capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "-b", "12X"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument -b/--minbytes: invalid size '12X'" in err
    assert "64K" in err


def test_size_sweep_multiplies_up_to_maxbytes_inclusive() -> None:
    assert size_sweep(8, 64 << 10, 8) == [8, 64, 512, 4096, 32768]
    assert size_sweep(1 << 20, 1 << 20, 2) == [1 << 20]


# -- option errors -----------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "message"), [
    (["--ops", "all_reduce,all_reduse"], "unknown operation 'all_reduse'"),
    (["--backend", "no_such_backend"], "no torchcomms backend named 'no_such_backend'"),
    (["-d", "int32", "-o", "avg"], "--op avg needs a floating-point datatype"),
    (["--nproc", "2", "-r", "2"], "root 2 is not a rank of a 2-rank run"),
])
def test_bad_options_fail_before_any_rank_starts(argv: list[str], message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


# -- the result check, against a collective simulated in this process ---------------------


def _reduce(tensors: list[torch.Tensor], redop: str) -> torch.Tensor:
    stacked = torch.stack(tensors)
    if redop == "avg":
        return stacked.sum(0).div_(len(tensors))
    return {"sum": stacked.sum, "prod": stacked.prod, "min": stacked.amin,
            "max": stacked.amax}[redop](0).to(stacked.dtype)


def _simulate(name: str, inputs: list[torch.Tensor], case: Case) -> list[torch.Tensor]:
    """What each rank's output holds after the collective, computed from every input."""
    n = len(inputs)
    if name == "all_reduce":
        return [_reduce(inputs, case.redop) for _ in range(n)]
    if name == "all_gather_single":
        return [torch.cat(inputs) for _ in range(n)]
    if name == "reduce_scatter_single":
        return list(_reduce(inputs, case.redop).chunk(n))
    if name == "all_to_all_single":
        return [torch.cat([inputs[src].chunk(n)[dst] for src in range(n)]) for dst in range(n)]
    if name == "broadcast":
        return [inputs[case.root].clone() for _ in range(n)]
    raise AssertionError(f"no simulation of {name}")


def _run_simulated(name: str, nranks: int, dtype: torch.dtype, redop: str, nbytes: int = 1000
                   ) -> tuple[list[Case], list[Buffers]]:
    op = OPS[name]
    cases = [Case(rank=r, nranks=nranks, dtype=dtype, device=torch.device("cpu"), redop=redop,
                  root=nranks - 1) for r in range(nranks)]
    count = op.count(nbytes, cases[0])
    bufs = [op.allocate(count, case) for case in cases]
    for case, buf in zip(cases, bufs, strict=True):
        op.fill(buf, case)
    outputs = _simulate(name, [b.input.clone() for b in bufs], cases[0])
    for buf, out in zip(bufs, outputs, strict=True):
        buf.output.copy_(out)
    return cases, bufs


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
@pytest.mark.parametrize(("dtype", "redop"), [
    (torch.float32, "sum"), (torch.bfloat16, "sum"), (torch.float16, "avg"),
    (torch.int8, "sum"), (torch.uint8, "max"), (torch.int32, "prod"), (torch.float64, "min"),
])
def test_a_correct_collective_has_no_wrong_elements(name: str, nranks: int, dtype: torch.dtype,
                                                    redop: str) -> None:
    cases, bufs = _run_simulated(name, nranks, dtype, redop)
    for case, buf in zip(cases, bufs, strict=True):
        assert OPS[name].count_wrong(buf, case) == 0


@pytest.mark.parametrize("name", ["all_gather_single", "all_to_all_single"])
def test_swapped_chunks_are_wrong_at_every_element(name: str) -> None:
    cases, bufs = _run_simulated(name, 4, torch.float32, "sum")
    out = bufs[0].output
    first, second = out.chunk(4)[:2]
    saved = first.clone()
    first.copy_(second)
    second.copy_(saved)
    assert OPS[name].count_wrong(bufs[0], cases[0]) == 2 * first.numel()


def test_reduce_scatter_of_another_ranks_chunk_is_wrong_at_every_element() -> None:
    cases, bufs = _run_simulated("reduce_scatter_single", 4, torch.float32, "sum")
    bufs[0].output.copy_(bufs[1].output)
    assert OPS["reduce_scatter_single"].count_wrong(bufs[0], cases[0]) == bufs[0].output.numel()


def test_a_broadcast_that_never_arrived_is_wrong_at_every_element() -> None:
    cases, bufs = _run_simulated("broadcast", 4, torch.bfloat16, "sum")
    OPS["broadcast"].fill(bufs[0], cases[0])  # rank 0 still holds its own data
    assert OPS["broadcast"].count_wrong(bufs[0], cases[0]) == bufs[0].output.numel()


# -- launching ---------------------------------------------------------------------------


def _die_on_rank_one() -> int:
    if os.environ[_env.RANK] == "1":
        os._exit(7)
    time.sleep(120)
    return 0


def test_launch_stops_the_other_ranks_when_one_dies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch_module, "FAILURE_GRACE_S", 0.5)
    start = time.monotonic()
    assert launch(2, _die_on_rank_one) == 7
    assert time.monotonic() - start < 60


def _launcher_free_environment() -> dict[str, str]:
    env = dict(os.environ)
    for rank_var, size_var, _source in _env.LAUNCHER_RANK_SIZE:
        env.pop(rank_var, None)
        env.pop(size_var, None)
    return env


_OP_HEADER = re.compile(r"^# (\w+): backend gloo, 2 ranks, device cpu, dtype float32$")


def test_bench_runs_every_operation_without_wrong_results() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "torchcomms_core.cli", "bench", "--nproc", "2", "-b", "8",
         "-e", "64K", "-f", "8", "-n", "2", "-w", "1"],
        capture_output=True, text=True, timeout=300, env=_launcher_free_environment(),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows: dict[str, list[list[str]]] = {}
    current = None
    for line in proc.stdout.splitlines():
        match = _OP_HEADER.match(line)
        if match:
            current = match.group(1)
            rows[current] = []
        elif line.strip() and not line.startswith("#"):
            assert current is not None, f"row before any table header: {line!r}"
            rows[current].append(line.split())
    assert list(rows) == list(OPS)
    for name, table in rows.items():
        assert [int(cells[0]) for cells in table] == [8, 64, 512, 4096, 32768], name
        assert [cells[-1] for cells in table] == ["0"] * len(table), name
    assert proc.stdout.count("# Out of bounds values : 0 OK") == len(OPS)

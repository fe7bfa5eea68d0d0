"""Tests of ``torchcomms bench``: the size parser, option errors, the result check and runs.

End-to-end tests launch two real gloo ranks; the others run in this process. Figures are
printed by the runs, never asserted.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from torchcomms_core.bench import launch as launch_module
from torchcomms_core.bench.compare import c10d_backend
from torchcomms_core.bench.data import IN_PLACE, pair_sizes, triangle, uneven_sizes
from torchcomms_core.bench.launch import launch
from torchcomms_core.bench.ops import DEFAULT_OPS, OPS, Buffers, Case, available_ops
from torchcomms_core.bench.sizes import parse_size, size_sweep
from torchcomms_core.cli import main
from torchcomms_core.foundation import env as _env
from torchcomms_core.plugin_host.backends import get_backend_class

# -- sizes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", 8),
        ("64K", 64 << 10),
        ("1M", 1 << 20),
        ("2G", 2 << 30),
        ("64k", 64 << 10),
    ],
)
def test_parse_size_reads_binary_suffixes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["12X", "", "1.5M", "-1", "M", "0"])
def test_parse_size_rejects_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_a_bad_size_is_an_argparse_error_naming_the_option(
    capsys: pytest.CaptureFixture[str],
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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ops", "all_reduce,all_reduse"], "unknown operation 'all_reduse'"),
        (["--backend", "no_such_backend"], "no torchcomms backend named 'no_such_backend'"),
        (["-d", "int32", "-o", "avg"], "--op avg needs a floating-point datatype"),
        (["--nproc", "2", "-r", "2"], "root 2 is not a rank of a 2-rank run"),
        (["--ops", "all,all_reduce"], "do not combine it with others"),
        (["--ops", "send_recv", "--nproc", "1"], "send_recv needs at least 2 ranks, got 1"),
        (["--ops", "quantized_all_reduce", "-d", "int32"], "needs a floating-point datatype"),
        (["--inplace", "2"], "argument --inplace: invalid choice: '2'"),
        (["--compare", "nosuch"], "--compare 'nosuch' is neither c10d nor mpi4py nor"),
        (["--json", "/no/such/folder/out.json"], "--json /no/such/folder/out.json: folder"),
        (["--from-json", "run.json"], "--from-json plots saved runs: give --plot PNG too"),
    ],
)
def test_bad_options_fail_before_any_rank_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


# -- the result check, against a collective simulated in this process ---------------------


def _reduce(tensors: list[torch.Tensor], redop: str) -> torch.Tensor:
    stacked = torch.stack(tensors)
    if redop == "avg":
        return stacked.sum(0).div_(len(tensors))
    return {"sum": stacked.sum, "prod": stacked.prod, "min": stacked.amin, "max": stacked.amax}[
        redop
    ](0).to(stacked.dtype)


def _simulate(name: str, bufs: list[Buffers], case: Case) -> list[torch.Tensor | None]:
    """What each rank's output holds after the collective (``None``: left undefined)."""
    n = len(bufs)
    inputs = [b.input.clone() for b in bufs]
    root = case.root
    if name in ("all_reduce", "all_reduce_coalesced", "quantized_all_reduce"):
        return [_reduce(inputs, case.redop) for _ in range(n)]
    if name == "reduce":
        return [_reduce(inputs, case.redop) if r == root else None for r in range(n)]
    if name in ("all_gather_single", "all_gather", "all_gather_v"):
        return [torch.cat(inputs) for _ in range(n)]
    if name in ("gather", "gather_single"):
        return [torch.cat(inputs) if r == root else None for r in range(n)]
    if name in (
        "reduce_scatter_single",
        "reduce_scatter",
        "quantized_reduce_scatter",
        "reduce_scatter_quantized",
    ):
        return list(_reduce(inputs, case.redop).chunk(n))
    if name == "reduce_scatter_v":
        return list(_reduce(inputs, case.redop).split(bufs[0].input_splits))
    if name in ("all_to_all_single", "all_to_all"):
        return [torch.cat([inputs[src].chunk(n)[dst] for src in range(n)]) for dst in range(n)]
    if name == "all_to_all_v_single":
        blocks = [inputs[src].split(bufs[src].input_splits) for src in range(n)]
        return [torch.cat([blocks[src][dst] for src in range(n)]) for dst in range(n)]
    if name == "broadcast":
        return [inputs[root].clone() for _ in range(n)]
    if name == "scatter":
        return list(inputs[root].chunk(n))
    # Each carries rank 0's data there and back.
    if name in ("send_recv", "window_put", "transport_write", "transport_read"):
        return [inputs[0].clone() if r < 2 else None for r in range(n)]
    raise AssertionError(f"no simulation of {name}")


def _run_simulated(
    name: str,
    nranks: int,
    dtype: torch.dtype,
    redop: str,
    form: str | None = None,
    nbytes: int = 1000,
) -> tuple[list[Case], list[Buffers]]:
    op = _AVAILABLE[name]
    cases = [
        Case(
            rank=r,
            nranks=nranks,
            dtype=dtype,
            device=torch.device("cpu"),
            redop=redop,
            root=nranks - 1,
        )
        for r in range(nranks)
    ]
    count = op.count(nbytes, cases[0])
    bufs = [op.allocate(count, case, form) for case in cases]
    for case, buf in zip(cases, bufs, strict=True):
        op.fill(buf, case)
    outputs = _simulate(name, bufs, cases[0])
    for buf, out in zip(bufs, outputs, strict=True):
        if out is not None:
            buf.output.copy_(out)
    return cases, bufs


# Plugin operations too: the quantized ones are checked against their error bound.
_AVAILABLE = available_ops()
_DATA_OPS = [(name, form) for name, op in _AVAILABLE.items() if op.moves_data for form in op.forms]


_DTYPE_REDOPS = [
    (torch.float32, "sum"),
    (torch.bfloat16, "sum"),
    (torch.float16, "avg"),
    (torch.int8, "sum"),
    (torch.uint8, "max"),
    (torch.int32, "prod"),
    (torch.float64, "min"),
]
# Only the combinations an operation accepts; refused ones never start a rank (see
# test_bad_options_fail_before_any_rank_starts).
_ACCEPTED = [
    (name, form, nranks, dtype, redop)
    for name, form in _DATA_OPS
    for nranks in (1, 2, 3, 4)
    for dtype, redop in _DTYPE_REDOPS
    if _AVAILABLE[name].refuses(dtype, redop, nranks) is None
]


@pytest.mark.parametrize(("name", "form", "nranks", "dtype", "redop"), _ACCEPTED)
def test_a_correct_collective_has_no_wrong_elements(
    name: str, form: str, nranks: int, dtype: torch.dtype, redop: str
) -> None:
    op = _AVAILABLE[name]
    cases, bufs = _run_simulated(name, nranks, dtype, redop, form)
    for case, buf in zip(cases, bufs, strict=True):
        assert op.count_wrong(buf, case) == 0


@pytest.mark.parametrize(("name", "form"), _DATA_OPS)
def test_an_output_the_collective_never_wrote_is_wrong(name: str, form: str) -> None:
    op = _AVAILABLE[name]
    cases = [
        Case(rank=r, nranks=3, dtype=torch.float32, device=torch.device("cpu"), root=2)
        for r in range(3)
    ]
    count = op.count(1000, cases[0])
    # The broadcast root's input already is the result.
    checked = [
        c for c in cases if op.holds_result(c) and not (name == "broadcast" and c.rank == c.root)
    ]
    for case in checked:
        bufs = op.allocate(count, case, form)
        op.fill(bufs, case)
        assert op.count_wrong(bufs, case) > 0, (name, form, case.rank)


@pytest.mark.parametrize(
    "name", ["all_gather_single", "all_to_all_single", "all_gather", "all_to_all"]
)
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


def test_in_place_buffers_alias_the_ranks_slice() -> None:
    case = Case(rank=1, nranks=4, dtype=torch.float32, device=torch.device("cpu"))
    gather = OPS["all_gather_single"].allocate(16, case, IN_PLACE)
    assert gather.input.data_ptr() == gather.output.data_ptr() + 4 * 4
    scatter = OPS["reduce_scatter_single"].allocate(16, case, IN_PLACE)
    assert scatter.output.data_ptr() == scatter.input.data_ptr() + 4 * 4


def test_uneven_splits_differ_per_pair_and_keep_every_rank_at_count() -> None:
    n, count = 4, triangle(4) * 3
    assert uneven_sizes(count, n) == [3, 6, 9, 12]
    sends = [pair_sizes(count, n, src) for src in range(n)]
    assert all(sum(row) == count for row in sends)
    assert all(sum(sends[src][dst] for src in range(n)) == count for dst in range(n))
    assert len({sends[src][dst] for src in range(n) for dst in range(n)}) > 1


def test_every_operation_names_its_torch_distributed_equivalent_or_has_none() -> None:
    import torch.distributed as dist

    case = Case(rank=0, nranks=2, dtype=torch.float32, device=torch.device("cpu"))
    for name, op in available_ops().items():
        function = op.c10d_function_name(dist)
        if op.c10d_refuses(case, "gloo") is None:
            assert function is not None, name
            assert all(hasattr(dist, part) for part in function.split("/")), (name, function)
        else:
            assert function is None, name


def test_compare_needs_a_backend_torch_distributed_also_runs() -> None:
    assert c10d_backend("ncclx") == "nccl"
    with pytest.raises(ValueError, match="backend 'vendor' has no such equivalent"):
        c10d_backend("vendor")


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
_HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _bench(*argv: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "torchcomms_core.cli", "bench", "--nproc", "2", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=_launcher_free_environment(),
    )
    # Figures are shown, never asserted: pytest -s prints them.
    print(proc.stdout, proc.stderr, sep="\n")
    return proc


def _tables(text: str) -> dict[str, list[list[str]]]:
    """Rows (lists of cells) of every table in ``text``, by operation."""
    rows: dict[str, list[list[str]]] = {}
    current = None
    for line in text.splitlines():
        match = _OP_HEADER.match(line)
        if match:
            current = match.group(1)
            rows[current] = []
        elif line.strip() and not line.startswith("#"):
            assert current is not None, f"row before any table header: {line!r}"
            rows[current].append(line.split())
    return rows


def test_bench_runs_the_default_operations_without_wrong_results() -> None:
    proc = _bench("-b", "8", "-e", "64K", "-f", "8", "-n", "2", "-w", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _tables(proc.stdout)
    assert list(rows) == list(DEFAULT_OPS)
    for name, table in rows.items():
        assert [int(cells[0]) for cells in table] == [8, 64, 512, 4096, 32768], name
        # The backend's algorithm comes last where it chooses one (#45), #wrong before it.
        chooses = name in get_backend_class("gloo").algorithms
        wrong = [cells[-2] if chooses else cells[-1] for cells in table]
        assert wrong == ["0"] * len(table), name
        if chooses:
            assert {cells[-1] for cells in table} <= {"engine", "pairwise"}, name
    assert proc.stdout.count("# Out of bounds values : 0 OK") == len(DEFAULT_OPS)
    assert proc.stdout.count("# Avg bus bandwidth    : ") == len(DEFAULT_OPS)


@pytest.fixture(scope="module")
def every_op_compared(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path | None]:
    """One run of ``--ops all --compare c10d --json -`` (and ``--plot`` with matplotlib)."""
    png = tmp_path_factory.mktemp("plot") / "bench.png" if _HAS_MATPLOTLIB else None
    plot = ["--plot", str(png)] if png is not None else []
    proc = _bench(
        "--ops",
        "all",
        "--compare",
        "c10d",
        "--json",
        "-",
        "-b",
        "8",
        "-e",
        "4K",
        "-f",
        "8",
        "-n",
        "3",
        "-w",
        "1",
        *plot,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, png


def test_json_on_stdout_is_valid_and_has_every_field(every_op_compared) -> None:
    document = json.loads(every_op_compared[0].stdout)
    header = document["header"]
    for key in (
        "backend",
        "device",
        "ranks",
        "dtype",
        "redop",
        "torch_version",
        "hostname",
        "date",
        "compare",
        "c10d_functions",
    ):
        assert key in header, key
    assert (header["backend"], header["device"], header["ranks"]) == ("gloo", "cpu", 2)
    assert {row["op"] for row in document["rows"]} == set(header["ops"])
    for row in document["rows"]:
        for key in ("size", "count", "type", "redop", "root", "busbw_factor", "passes"):
            assert key in row, key
        for p in row["passes"]:
            for key in (
                "form",
                "time_us",
                "min_us",
                "avg_us",
                "max_us",
                "algbw_gbps",
                "busbw_gbps",
                "wrong",
                "rank_times_us",
                "c10d",
                "ratio",
            ):
                assert key in p, key
            assert p["min_us"] <= p["avg_us"] <= p["max_us"] == p["time_us"]


def test_every_operation_runs_at_two_ranks_with_no_wrong_result(every_op_compared) -> None:
    document = json.loads(every_op_compared[0].stdout)
    ran = {row["op"] for row in document["rows"]}
    assert ran == set(available_ops())
    for row in document["rows"]:
        for p in row["passes"]:
            if row["moves_data"]:
                assert p["wrong"] == 0, (row["op"], row["size"], p["form"])
            if p["c10d"] is not None:
                assert p["c10d"]["wrong"] in (0, None), (row["op"], row["size"], p["form"])
    forms = {(row["op"], p["form"]) for row in document["rows"] for p in row["passes"]}
    assert ("all_gather_single", IN_PLACE) in forms
    assert ("reduce_scatter_single", IN_PLACE) in forms
    assert [row["size"] for row in document["rows"] if row["op"] == "barrier"] == [0]


def test_compare_prints_the_c10d_time_and_the_ratio_beside_it(every_op_compared) -> None:
    proc = every_op_compared[0]
    tables = _tables(proc.stderr)
    assert "ours/c10d" in proc.stderr and "IQR" in proc.stderr
    document = json.loads(proc.stdout)
    compared = document["header"]["c10d_functions"]
    assert compared["all_reduce"] == "all_reduce"
    assert compared["all_gather_v"] is None
    for name, table in tables.items():
        # gloo's algorithm comes last where it chooses one (#45).
        chooses = name in get_backend_class("gloo").algorithms
        for cells in table:
            c10d, ratio, spread = cells[-4:-1] if chooses else cells[-3:]
            if compared[name] is None:
                assert (c10d, ratio, spread) == ("n/a", "n/a", "n/a"), name
            else:
                assert float(ratio) > 0 and re.fullmatch(r"[\d.]+-[\d.]+", spread), cells
    assert "# Out of bounds values : 0 OK (c10d: 0 OK)" in proc.stderr


@pytest.mark.skipif(not _HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_plot_writes_a_png(every_op_compared) -> None:
    png = every_op_compared[1]
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(not _HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_saved_runs_plot_together(
    every_op_compared, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "run.json"
    saved.write_text(every_op_compared[0].stdout)
    png = tmp_path / "again.png"
    assert main(["bench", "--plot", str(png), "--from-json", str(saved), str(saved)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plot_without_matplotlib_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes the import fail
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--plot", str(tmp_path / "x.png")])
    assert exit_info.value.code == 2
    assert "pip install 'torchcomms-core[plot]'" in capsys.readouterr().err


def test_probe_prints_positive_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--probe"]) == 0
    out = capsys.readouterr().out
    with capsys.disabled():
        print(out)
    figures = re.findall(
        r"^(memcpy|loopback TCP \w+ ?\w*).*?:\s+([\d.]+) (GB/s|us)", out, re.MULTILINE
    )
    assert [unit for _name, _value, unit in figures] == ["GB/s", "GB/s", "us"], out
    assert all(float(value) > 0 for _name, value, _unit in figures), out

"""Tuner plugins (#45), on real shm ranks at 2 and 4: out-of-tree tuners installed with pip
change shm's choices and results stay exact; tuners that raise, answer nonsense or fail
to start are reported once and the default rules decide; stale and broken tables are
ignored with one warning; ranks that disagree all fall back to the default rules; hints
that force an algorithm win; ``torchcomms tune`` writes a table later communicators use.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import torchcomms
from torchcomms_core.foundation import env as _env
from torchcomms_core.plugin import Query, Tuner, register_tuner
from torchcomms_core.plugin_host.backends import backend_version, get_backend_class
from torchcomms_core.plugin_host.tuning_table import FORMAT, load_table, table_path, write_table
from torchcomms_core.spec.tuning import (
    Algorithm,
    Choice,
    OpAlgorithms,
    Tuning,
    TuningWarning,
    _reset_reported,
    size_bucket,
)
from torchcomms_core.testing import current_rank, unique_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [ROOT / "examples" / "tuner_plugin", ROOT / "tests" / "plugins" / "tuner_package"]
SCOREMAP = "shm:all_reduce:0-:chunked;shm:all_to_all_single:0-:direct"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The example tuner and the test tuners, installed with pip into a folder of their own
    (ranks put it on their path; the test process's own environment stays as it is)."""
    target = tmp_path_factory.mktemp("tuners") / "site"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "--target",
            str(target),
            *map(str, PACKAGES),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert any(p.name.startswith("torchcomms_exampletuner-") for p in target.iterdir())
    return str(target)


@contextlib.contextmanager
def _setting(path: str | None, env: dict[str, str]) -> Iterator[None]:
    """In a rank: ``path`` on sys.path and ``env`` set, both undone afterwards (the rank
    processes serve other tests too)."""
    saved = {k: os.environ.get(k) for k in env}
    if path is not None:
        sys.path.insert(0, path)
    os.environ.update(env)
    _reset_reported()
    try:
        yield
    finally:
        if path is not None:
            sys.path.remove(path)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _exercise(comm: Any) -> dict[str, Any]:
    """all_reduce at three sizes and an all_to_all_single of 1 MiB blocks, checked exactly."""
    r, n = comm.get_rank(), comm.get_size()
    tuning = comm.get_backend_impl().tuning
    ok, chosen = True, {}
    for count in (2, 3000, 70000, 400000):
        t = torch.arange(count, dtype=torch.int64) * (r + 1)
        comm.all_reduce(t, torchcomms.ReduceOp.SUM)
        ok &= bool(torch.equal(t, torch.arange(count, dtype=torch.int64) * (n * (n + 1) // 2)))
        chosen[f"all_reduce/{count * 8}"] = str(tuning.last["all_reduce"])
    block = 1 << 17  # int64 elements: 1 MiB per block
    inp = torch.arange(n * block, dtype=torch.int64) + r * 10**9
    out = torch.empty_like(inp)
    comm.all_to_all_single(out, inp)
    want = torch.cat(
        [torch.arange(r * block, (r + 1) * block, dtype=torch.int64) + p * 10**9 for p in range(n)]
    )
    ok &= bool(torch.equal(out, want))
    chosen["all_to_all_single"] = str(tuning.last["all_to_all_single"])
    return {
        "ok": ok,
        "n": n,
        "chosen": chosen,
        "status": tuning.status,
        "cma_ok": bool(getattr(comm.get_backend_impl(), "_cma_ok", False)),
        # shm's default for 1 MiB blocks: direct reads from cma_bytes (set when oversubscribed).
        "a2a_default": "direct" if 0 < comm.get_backend_impl()._cma <= 1 << 20 else "staged",
    }


def _run_shm(hints: dict[str, str] | None = None, split: bool = False) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        comm = torchcomms.new_comm("shm", "cpu", name=unique_name("tuned"), hints=hints)
        try:
            out = _exercise(comm)
            if split:  # a split's members agree on the child's tuner too
                for again in ("child", "again"):
                    child = comm.split(list(range(comm.get_size())), name=unique_name(again))
                    assert child is not None
                    out[again] = _exercise(child)
                    child.finalize()
        finally:
            comm.finalize()
    out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, TuningWarning)]
    out["other_warnings"] = [
        str(w.message) for w in caught if not issubclass(w.category, TuningWarning)
    ]
    return out


# -- bodies run on every rank --------------------------------------------------------------


def body_scoremap(path: str, how: str) -> dict[str, Any]:
    if how == "env":
        with _setting(path, {"TORCHCOMM_TUNER": "scoremap", "TORCHCOMM_SCOREMAP": SCOREMAP}):
            return _run_shm(split=True)
    with _setting(path, {}):
        return _run_shm({"tuner": "scoremap", "tuner.scoremap": SCOREMAP})


def body_defaults() -> dict[str, Any]:
    with _setting(None, {"TORCHCOMM_TUNER": "none"}):
        return _run_shm()


def body_misbehaving(path: str, tuner: str) -> dict[str, Any]:
    with _setting(path, {}):
        return _run_shm({"tuner": tuner})


def body_table(directory: str) -> dict[str, Any]:
    with _setting(None, {_env.TUNING_DIR: directory, "TORCHCOMM_TUNER": ""}):
        return _run_shm()


def body_disagree(path: str, odd: int) -> dict[str, Any]:
    # Rank ``odd`` asks the scoremap tuner; every other rank asks none.
    env = {"TORCHCOMM_TUNER": "scoremap" if current_rank() == odd else "none"}
    with _setting(path, {**env, "TORCHCOMM_SCOREMAP": SCOREMAP}):
        return _run_shm()


def body_forced(path: str) -> dict[str, Any]:
    with _setting(path, {}):
        out = _run_shm(
            {
                "tuner": "scoremap",
                "tuner.scoremap": SCOREMAP,
                "algorithm.all_reduce": "one_step",
                "cma_bytes": "0",
            }
        )
        try:
            torchcomms.new_comm(
                "shm", "cpu", name=unique_name("bad"), hints={"algorithm.all_reduce": "fastest"}
            )
            out["bad_hint"] = "accepted"
        except torchcomms.CommInputError as exc:
            out["bad_hint"] = str(exc)
    return out


def body_flight_recorder(path: str) -> dict[str, Any]:
    from torchcomms.hooks import FlightRecorderHook

    with _setting(path, {"TORCHCOMM_TUNER": "scoremap", "TORCHCOMM_SCOREMAP": SCOREMAP}):
        comm = torchcomms.new_comm("shm", "cpu", name=unique_name("fr"))
        # Isolated: the process-wide ring also holds what earlier tests' communicators ran.
        hook = FlightRecorderHook(max_entries=16, isolated=True)
        hook.register_with_comm(comm)
        comm.all_reduce(torch.ones(4), torchcomms.ReduceOp.SUM)
        comm.barrier()
        entries = hook.dump_dict()["entries"]
        hook.unregister()
        comm.finalize()
    return {e["profiling_name"]: e.get("algorithm") for e in entries}


# -- tests -------------------------------------------------------------------------------


def _defaults_of(res: dict[str, Any]) -> None:
    from torchcomms_shm.algorithms import one_step_limit

    assert res["chosen"]["all_reduce/16"] == "one_step"
    # One step up to the limit for the rank count (every size at 2 ranks, 1 MiB at 4);
    # above: measured where the ranks can read each other's memory, else chunked.
    above = "measured" if res["cma_ok"] else "chunked"
    for nbytes in (560000, 3200000):
        want = "one_step" if nbytes <= one_step_limit(res["n"]) else above
        assert res["chosen"][f"all_reduce/{nbytes}"] == want, nbytes
    if res["n"] > 2:
        assert res["chosen"]["all_reduce/3200000"] == above
    assert res["chosen"]["all_to_all_single"] == res["a2a_default"]


@pytest.mark.parametrize("how", ["env", "hint"])
def test_an_installed_tuner_changes_shms_choices_and_results_stay_exact(
    pool, installed: str, how: str
) -> None:
    for res in pool.run(body_scoremap, installed, how):
        assert res["ok"], res
        assert res["warnings"] == [] and res["other_warnings"] == [], res
        assert res["status"].startswith("tuner 'scoremap' from torchcomms-exampletuner 0.1.0")
        # The default takes one step at these sizes; the tuner says chunked everywhere.
        assert set(v for k, v in res["chosen"].items() if k.startswith("all_reduce")) == {"chunked"}
        assert res["chosen"]["all_to_all_single"] == ("direct" if res["cma_ok"] else "staged")
        if how == "env":
            for child in (res["child"], res["again"]):
                assert child["ok"] and child["status"] == res["status"], child
                assert child["chosen"] == res["chosen"], child


def test_without_a_tuner_the_default_rules_decide(pool) -> None:
    for res in pool.run(body_defaults):
        assert res["ok"] and res["warnings"] == [] and res["status"] == "default rules", res
        _defaults_of(res)


@pytest.mark.parametrize(
    ("tuner", "count", "says"),
    [
        # Reported once, whatever it is asked next (the arena, chosen inside init, is
        # decided before the ranks have agreed on the tuner: by the default rule).
        ("raises", 1, ["raised RuntimeError: tuner exploded on all_reduce"]),
        # Once per operation it answered wrongly for: all_reduce, all_to_all_single.
        (
            "nonsense",
            2,
            ["answered algorithm 'warp-drive', which is not one of", "answered 'fast', not a"],
        ),
        ("badparams", 2, ["chunked(turbo=True): 'chunked' takes no parameter 'turbo'"]),
        ("brokeninit", 1, ["is not used: OSError: cannot open /nonexistent/tuner.db"]),
    ],
)
def test_a_misbehaving_tuner_is_reported_once_and_the_calls_run_on_the_defaults(
    pool, installed: str, tuner: str, count: int, says: list[str]
) -> None:
    for res in pool.run(body_misbehaving, installed, tuner):
        assert res["ok"], res
        _defaults_of(res)
        assert len(res["warnings"]) == count, res["warnings"]
        for expected in says:
            assert any(expected in m for m in res["warnings"]), (expected, res["warnings"])
        for message in res["warnings"]:
            assert f"tuner {tuner!r} from torchcomms-testtuners 0.0.1" in message


def _table(directory: Path, world: int, **changes: Any) -> dict[str, Any]:
    table = {
        "format": FORMAT,
        "host": _env.host_id(),
        "backend": "shm",
        "version": backend_version(get_backend_class("shm")),
        "world_size": world,
        "ranks_per_host": world,
        "rules": [
            {"op": "all_reduce", "min_bytes": 0, "max_bytes": 1 << 40, "algorithm": "chunked"}
        ],
        **changes,
    }
    write_table(table_path("shm", world, str(directory)), table)
    return table


def test_a_table_for_this_host_is_used_without_asking(pool, tmp_path: Path) -> None:
    _table(tmp_path, pool.world_size)
    for res in pool.run(body_table, str(tmp_path)):
        assert res["ok"] and res["warnings"] == [], res
        assert "tuner 'table' from torchcomms-core" in res["status"]
        assert "[table:" in res["status"] and "[table:none]" not in res["status"]
        assert res["chosen"]["all_reduce/16"] == "chunked"


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"host": "another-host"}, "another host 'another-host'"),
        ({"version": "0.0.0-old"}, "version '0.0.0-old'"),
        ({"backend": "gloo"}, "backend 'gloo'"),
        ({"ranks_per_host": 99}, "ranks_per_host 99"),
    ],
)
def test_a_stale_table_is_ignored_with_one_warning(
    pool, tmp_path: Path, changes: dict[str, Any], says: str
) -> None:
    _table(tmp_path, pool.world_size, **changes)
    for res in pool.run(body_table, str(tmp_path)):
        assert res["ok"], res
        _defaults_of(res)
        assert len(res["warnings"]) == 1, res["warnings"]
        assert says in res["warnings"][0] and "is ignored" in res["warnings"][0]


def test_a_broken_table_is_ignored_with_one_warning(pool, tmp_path: Path) -> None:
    path = table_path("shm", pool.world_size, str(tmp_path))
    Path(path).write_text('{"format": "torchcomms-tuning/1", "rules": [{"op": 3}')
    for res in pool.run(body_table, str(tmp_path)):
        assert res["ok"], res
        _defaults_of(res)
        assert len(res["warnings"]) == 1 and "not valid JSON" in res["warnings"][0]


def test_ranks_that_disagree_all_use_the_default_rules_and_say_which(pool, installed: str) -> None:
    odd = pool.world_size - 1
    for rank, res in enumerate(pool.run(body_disagree, installed, odd, timeout=120)):
        assert res["ok"], res
        assert res["status"] == "default rules"
        _defaults_of(res)
        if rank != odd:  # no tuner here: nothing to say, the default rules as always
            assert res["warnings"] == [], res["warnings"]
            continue
        assert len(res["warnings"]) == 1, res["warnings"]
        message = res["warnings"][0]
        assert "tuners differ: 1 of" in message and "default rules" in message, message
        others = ", ".join(str(r) for r in range(odd))
        assert f"rank(s) {others} another or none" in message, message


def test_hints_that_force_an_algorithm_win_over_the_tuner(pool, installed: str) -> None:
    for res in pool.run(body_forced, installed):
        assert res["ok"], res
        # The forced choice is taken wherever it can run (one step holds at most a chunk:
        # larger messages still go in chunks, the choice recorded is the one forced).
        assert {v for k, v in res["chosen"].items() if k.startswith("all_reduce")} == {"one_step"}
        # cma_bytes=0 is shm's own hint: it decides all_to_all, not the tuner.
        assert res["chosen"]["all_to_all_single"] == "staged"
        assert "no all_reduce algorithm 'fastest'" in res["bad_hint"]
        assert "one_step" in res["bad_hint"] and "chunked" in res["bad_hint"]


def test_flight_recorder_entries_name_the_chosen_algorithm(pool2, installed: str) -> None:
    for res in pool2.run(body_flight_recorder, installed):
        assert res == {"shm:all_reduce": "chunked", "shm:barrier": None}, res


def test_tune_writes_a_table_that_later_communicators_use(pool, tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHCOMM_", "MASTER_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE")
    }
    env["OMP_NUM_THREADS"] = "1"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchcomms_core.cli",
            "tune",
            "--backend",
            "shm",
            "--nproc",
            str(pool.world_size),
            "--ops",
            "all_reduce,all_to_all_single,reduce_scatter_single",
            "-b",
            "1K",
            "-e",
            "256K",
            "-f",
            "16",
            "-n",
            "2",
            "-w",
            "1",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert (
        "not swept: reduce_scatter_single (the backend declares no algorithms for it)" in res.stdout
    )
    path = table_path("shm", pool.world_size, str(tmp_path))
    table, digest, why = load_table(path)
    assert table is not None and why == "", why
    assert table["host"] == _env.host_id() and table["world_size"] == pool.world_size
    ops = {r["op"] for r in table["rules"]}
    assert ops == {"all_reduce", "all_to_all_single"}, table["rules"]
    ranges = [(r["min_bytes"], r["max_bytes"]) for r in table["rules"] if r["op"] == "all_reduce"]
    assert ranges[0][0] == 0 and all(
        a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False)
    )
    for rule in table["rules"]:
        assert rule["algorithm"] in ("one_step", "chunked", "staged", "direct", "measured")
        assert all(v is None or v > 0 for v in rule["measured"].values())
    # One rule a line: readable and editable by hand.
    assert Path(path).read_text().count('{"op"') == len(table["rules"])
    for ran in pool.run(body_table, str(tmp_path)):
        assert ran["ok"] and ran["warnings"] == [], ran
        assert f"[table:{digest}]" in ran["status"]


# -- in one process ------------------------------------------------------------------------


def test_choices_are_cached_per_size_bucket_and_checked() -> None:
    calls: list[int] = []

    def rule(backend: Any, query: Any) -> str:
        calls.append(query.nbytes)
        return "small" if query.nbytes <= 64 else "large"

    ops = {
        "all_reduce": OpAlgorithms(
            (Algorithm("small"), Algorithm("large", {"chunk": 4096})), default=rule
        )
    }
    tuning = Tuning(None, ops, backend="x", world_size=2)
    f32 = torch.float32
    assert [size_bucket(n) for n in (0, 1, 2, 3, 64, 65)] == [1, 1, 2, 4, 64, 128]
    assert str(tuning.choose("all_reduce", 64, f32)) == "small"
    assert str(tuning.choose("all_reduce", 33, f32)) == "small"  # the same bucket: cached
    assert str(tuning.choose("all_reduce", 65, f32)) == "large(chunk=4096)"
    assert calls == [64, 128]
    assert tuning.last["all_reduce"] == Choice("large", {"chunk": 4096})
    spec = ops["all_reduce"]
    assert spec.complete(Choice("large", {"chunk": 5}))[0] == Choice("large", {"chunk": 5})
    assert "must be a int" in spec.complete(Choice("large", {"chunk": "5"}))[1]
    assert "not one of" in spec.complete(Choice("huge"))[1]
    with pytest.raises(KeyError, match="declares no algorithms"):
        tuning.choose("broadcast", 8, f32)
    forced = Tuning(
        None,
        ops,
        backend="x",
        world_size=2,
        hints={"algorithm.all_reduce": "large", "algorithm.all_reduce.chunk": "64"},
    )
    assert str(forced.choose("all_reduce", 8, f32)) == "large(chunk=64)"
    with pytest.raises(torchcomms.CommInputError, match="must be a int"):
        Tuning(
            None,
            ops,
            backend="x",
            world_size=2,
            hints={"algorithm.all_reduce": "large", "algorithm.all_reduce.chunk": "lots"},
        )


def test_method_support_and_the_command_line_list_the_algorithms(capsys) -> None:
    from torchcomms_core.cli import main

    shm = torchcomms.method_support(get_backend_class("shm"), algorithms=True)
    assert shm["all_reduce"]["support"] == "native"
    assert [a["name"] for a in shm["all_reduce"]["algorithms"]] == [
        "one_step",
        "chunked",
        "direct",
        "measured",
    ]
    assert shm["all_to_all_single"]["forced_by"] == ["cma_bytes"]
    assert torchcomms.method_support(get_backend_class("shm"))["all_reduce"] == "native"
    assert main(["backends", "--algorithms"]) == 0
    out = capsys.readouterr().out
    for backend, op, algorithm in (
        ("shm", "all_to_all_single", "direct"),
        ("gloo", "reduce_scatter_single", "pairwise"),
        ("mpi", "all_reduce", "nonblocking"),
        ("hier", "all_reduce", "recursive_doubling"),
    ):
        assert backend in out and op in out and algorithm in out
    assert main(["tuners"]) == 0
    out = capsys.readouterr().out
    assert "table" in out and "torchcomms-core" in out
    assert main(["backends", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    gloo = next(r for r in rows if r["name"] == "gloo")
    assert gloo["algorithms"]["all_gather_single"]["default"].startswith("pairwise from 8 MiB")


def test_bench_shows_the_chosen_algorithm_per_row_and_in_json() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHCOMM_", "MASTER_"))}
    env.update(OMP_NUM_THREADS="1", TORCHCOMM_TUNER="none")
    ops = "all_reduce,reduce_scatter_single"
    # 4 ranks: one step up to 1 MiB there, another path at 2 MiB (at 2 ranks every size
    # takes one step).
    args = ["--backend", "shm", "--nproc", "4", "--ops", ops, "-b", "8"]
    args += ["-e", "2M", "-f", "512", "-n", "2", "-w", "1", "--inplace", "1", "--json", "-"]
    res = subprocess.run(
        [sys.executable, "-m", "torchcomms_core.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(res.stdout)["rows"]
    chosen = {(r["op"], r["size"]): r["algorithm"] for r in rows}
    large = chosen.get(("all_reduce", 2 << 20))
    assert large in ("measured", "chunked"), chosen  # measured where ranks read each other
    assert chosen == {
        ("all_reduce", 8): "one_step",
        ("all_reduce", 4096): "one_step",
        ("all_reduce", 2 << 20): large,
        ("reduce_scatter_single", 16): None,  # shm declares no algorithms for it
        ("reduce_scatter_single", 4096): None,
        ("reduce_scatter_single", 2 << 20): None,
    }, chosen
    lines = [line.split() for line in res.stderr.splitlines() if line.strip()]
    assert any(line[-1] == large and line[0] == str(2 << 20) for line in lines)
    assert sum("algorithm" in line for line in lines) == 1  # only all_reduce's table has it


class _Nonblocking(Tuner):
    """Answers ``nonblocking`` for mpi's all_reduce at every size."""

    def choose(self, query: Query) -> Choice | None:
        return Choice("nonblocking") if query.op == "all_reduce" else None


def body_mpi(disagree: bool) -> dict[str, Any]:
    register_tuner("test-nonblocking", _Nonblocking)
    name = "test-nonblocking" if not disagree or current_rank() == 0 else "none"
    with _setting(None, {"TORCHCOMM_TUNER": name}):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            comm = torchcomms.new_comm("mpi", "cpu", name=unique_name("mpi_tuned"))
            r, n = comm.get_rank(), comm.get_size()
            t = torch.full((4,), float(r + 1))
            comm.all_reduce(t, torchcomms.ReduceOp.SUM)  # the lean lane
            small = str(comm.get_backend_impl().tuning.last["all_reduce"])
            big = torch.full((1 << 15,), float(r + 1))
            comm.all_reduce(big, torchcomms.ReduceOp.SUM, async_op=True).wait()
            tuning = comm.get_backend_impl().tuning
            out = {
                "rank": r,
                "ok": t.tolist() == [n * (n + 1) / 2] * 4 and bool((big == n * (n + 1) / 2).all()),
                "chosen": str(tuning.last["all_reduce"]),
                "small": small,
                "status": tuning.status,
                "warnings": [
                    str(w.message) for w in caught if issubclass(w.category, TuningWarning)
                ],
            }
            comm.finalize()
    return out


@pytest.mark.parametrize("disagree", [False, True], ids=["agree", "disagree"])
def test_mpi_agrees_on_its_tuner_and_follows_it(mpi_pool, disagree: bool) -> None:
    for res in mpi_pool.run(body_mpi, disagree, timeout=120):
        assert res["ok"], res
        if disagree:
            assert res["chosen"] == "nonblocking"  # 128 KiB: the default above 64 KiB
            assert res["small"] == "blocking"
            assert res["status"] == "default rules", res
            # The rank with the tuner says so (through a shared store only it warns; with
            # mpiexec's own rendezvous every rank compares and warns).
            assert len(res["warnings"]) == (1 if res["rank"] == 0 else len(res["warnings"]))
            assert all("tuners differ" in w for w in res["warnings"])
            assert res["rank"] != 0 or res["warnings"]
        else:
            assert res["chosen"] == res["small"] == "nonblocking" and res["warnings"] == [], res
            assert res["status"].startswith("tuner 'test-nonblocking'"), res

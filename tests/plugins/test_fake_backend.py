"""The ``fake`` backend: every operation completes at once, nothing is communicated, any
world size; hooks, the flight recorder and NaN checks run on it in one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import torchcomms
from torchcomms.hooks import FlightRecorderHook, NanCheckHook
from torchcomms_core.testing import run_conformance, unique_name


def _fake(size: int = 8, rank: int = 3) -> torchcomms.TorchComm:
    return torchcomms.new_comm(
        "fake",
        torch.device("cpu"),
        name=unique_name("fake"),
        hints={"size": str(size), "rank": str(rank)},
    )


def test_any_world_size_and_every_operation_completes_untouched() -> None:
    comm = _fake(16, 5)
    assert (comm.get_rank(), comm.get_size(), comm.get_backend()) == (5, 16, "fake")
    t = torch.arange(4, dtype=torch.float32)
    work = comm.all_reduce(t, torchcomms.ReduceOp.AVG, async_op=True)
    assert work.wait() and work.status is torchcomms.WorkStatus.COMPLETED
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]  # outputs are left as they were
    p = torch.ones(2)
    comm.all_reduce(p, torchcomms.ReduceOp.PREMUL_SUM(3.0))
    assert p.tolist() == [1.0, 1.0]
    outs = [torch.full((2,), -1.0) for _ in range(16)]
    comm.all_gather(outs, torch.ones(2))
    assert all(o.tolist() == [-1.0, -1.0] for o in outs)
    got = torch.full((3,), 9.0)
    comm.recv(got, 0)
    assert got.tolist() == [9.0] * 3
    comm.send(torch.ones(3), 15)
    comm.barrier()
    batch = comm.batch_op_create()
    batch.send(torch.ones(1), 1).recv(torch.empty(1), 2)
    assert batch.issue(async_op=True).wait()
    sub = comm.split([1, 5, 9], "three")
    assert sub is not None and (sub.get_rank(), sub.get_size()) == (1, 3)
    assert comm.split([], "none") is None
    sub.finalize()
    comm.finalize()


def test_bad_input_is_still_refused() -> None:
    comm = _fake(4, 0)
    with pytest.raises(torchcomms.CommInputError, match="root"):
        comm.broadcast(torch.ones(1), 4)
    with pytest.raises(torchcomms.CommInputError):
        comm.all_gather([torch.empty(1)] * 3, torch.ones(1))
    comm.finalize()


def test_hooks_flight_recorder_and_nan_check_run_on_it() -> None:
    comm = _fake(8, 2)
    seen = []
    comm.register_pre_hook(lambda name, op_id, args: seen.append(str(name)))
    recorder = FlightRecorderHook(isolated=True).register_with_comm(comm)
    NanCheckHook().register_with_comm(comm)
    comm.all_reduce(torch.ones(2), torchcomms.ReduceOp.SUM)
    comm.broadcast(torch.ones(2), 0, async_op=True).wait()
    with pytest.raises(RuntimeError, match="NaN"):
        comm.all_reduce(torch.tensor([float("nan")]), torchcomms.ReduceOp.SUM)
    comm.finalize()
    assert [s.rsplit(".", 1)[-1] for s in seen[:2]] == ["all_reduce", "broadcast"]
    entries = json.loads(recorder.dump_json())["entries"]
    assert [e["profiling_name"] for e in entries[:2]] == ["fake:all_reduce", "fake:broadcast"]
    assert all(e["state"] == "completed" for e in entries[:2])


def test_rank_and_size_are_checked() -> None:
    with pytest.raises(torchcomms.CommInputError, match="rank 8 of size 8"):
        torchcomms.new_comm(
            "fake", "cpu", name=unique_name("fake"), hints={"size": "8", "rank": "8"}
        )
    with pytest.raises(torchcomms.CommInputError, match="not an integer"):
        torchcomms.new_comm("fake", "cpu", name=unique_name("fake"), hints={"size": "many"})


def test_launcher_environment_or_one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TORCHCOMM_RANK", "TORCHCOMM_SIZE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    alone = torchcomms.new_comm("fake", "cpu", name=unique_name("fake"))
    assert (alone.get_rank(), alone.get_size()) == (0, 1)
    alone.finalize()
    monkeypatch.setenv("TORCHCOMM_RANK", "2")
    monkeypatch.setenv("TORCHCOMM_SIZE", "6")
    launched = torchcomms.new_comm("fake", "cpu", name=unique_name("fake"))
    assert (launched.get_rank(), launched.get_size()) == (2, 6)
    launched.finalize()


def test_listed_by_the_cli_and_built_backends() -> None:
    assert "fake" in torchcomms.built_backends()
    res = subprocess.run(
        [sys.executable, "-m", "torchcomms_core.cli", "backends", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("TORCHCOMM_")},
    )
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert rows["fake"]["distribution"] == "torchcomms-core"
    assert rows["fake"]["runnable"] is True
    assert rows["fake"]["hint_keys"] == ["rank", "size"]


@pytest.mark.slow
def test_passes_the_api_shape_contracts_not_the_numerical_ones() -> None:
    res = run_conformance("fake", 4, extra_args=["-rs"])
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "4 passed" in res.stdout, res.stdout[-2000:]
    assert "communicates=False" in res.stdout  # the numerical contracts say why they skip
    assert "failed" not in res.stdout

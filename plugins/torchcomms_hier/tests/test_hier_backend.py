"""The hier backend on live ranks: results against flat gloo, levels, bad settings, faults.

Hosts are simulated with the hint ``host_id`` (four ranks: two hosts of two, or 3 + 1).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

import torchcomms
from torchcomms_core.testing import RankPool, current_rank, unique_name

REPO = Path(__file__).resolve().parents[3]
VENDOR_SRC = str(REPO / "examples" / "vendor_plugin" / "src")
#: Communicator timeout of the killed-peer tests.
KILL_TIMEOUT_S = 6.0
#: Host of each rank, by layout.
LAYOUTS = {"2x2": ["a", "a", "b", "b"], "3+1": ["a", "a", "a", "b"]}


def _register_vendor() -> None:
    """Make the example vendor plugin resolvable in this rank (it is not installed)."""
    if VENDOR_SRC not in sys.path:
        sys.path.insert(0, VENDOR_SRC)
    from torchcomms_examplevendor import ExampleVendorBackend

    if "examplevendor" not in torchcomms.available_backends():
        torchcomms.register_backend("examplevendor", ExampleVendorBackend)


def _hier(
    layout: str,
    local: dict[str, str] | None = None,
    more_hints: dict[str, str] | None = None,
    **extra: Any,
) -> Any:
    host = LAYOUTS[layout][current_rank()]
    hints = {"host_id": host, "local_backend": (local or {}).get(host, "gloo")}
    hints.update(more_hints or {})
    return torchcomms.new_comm("hier", "cpu", name=unique_name("hier"), hints=hints, **extra)


# -- results equal flat gloo's -------------------------------------------------------------


def _every_result(comm: Any, count: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every two-level operation on rank-dependent data; what each rank ends up holding."""
    r, n = comm.get_rank(), comm.get_size()
    gen = torch.Generator().manual_seed(1234 + r)
    if dtype.is_floating_point:
        base = torch.randn(count, generator=gen).to(dtype)
    else:
        base = torch.randint(-(2**20), 2**20, (count,), generator=gen).to(dtype)
    out: dict[str, torch.Tensor] = {}
    for op in ("SUM", "MAX", "MIN") + (() if dtype.is_floating_point else ("BXOR",)):
        t = base.clone()
        comm.all_reduce(t, getattr(torchcomms.ReduceOp, op))
        out[f"all_reduce_{op}"] = t
    for root in (0, n - 1, 1):
        t = base.clone()
        comm.broadcast(t, root)
        out[f"broadcast_{root}"] = t
        t = base.clone()
        comm.reduce(t, root, torchcomms.ReduceOp.SUM)
        if r == root:  # only root's result is defined (flat gloo leaves others' scratch)
            out[f"reduce_{root}"] = t
    gathered = torch.empty(n * count, dtype=dtype)
    comm.all_gather_single(gathered, base)
    out["all_gather_single"] = gathered
    parts = [torch.empty(count, dtype=dtype) for _ in range(n)]
    comm.all_gather(parts, base)
    out["all_gather"] = torch.cat(parts)
    scattered = torch.empty(count, dtype=dtype)
    wide = torch.cat([base * (k + 1) for k in range(n)])
    comm.reduce_scatter_single(scattered, wide, torchcomms.ReduceOp.SUM)
    out["reduce_scatter_single"] = scattered
    t = base.clone()
    work = comm.all_reduce(t, torchcomms.ReduceOp.SUM, async_op=True)
    work.wait()
    out["all_reduce_async"] = t
    return out


def body_against_flat_gloo(layout: str, counts: list[int], dtype_name: str) -> list[str]:
    """Every operation at every count on hier and on flat gloo; the keys that differ."""
    dtype = getattr(torch, dtype_name)
    hier = _hier(layout)
    flat = torchcomms.new_comm("gloo", "cpu", name=unique_name("flat"))
    differ = []
    for count in counts:
        mine, theirs = _every_result(hier, count, dtype), _every_result(flat, count, dtype)
        assert mine.keys() == theirs.keys()
        for key, value in mine.items():
            if dtype.is_floating_point:
                same = torch.allclose(value.double(), theirs[key].double(), rtol=1e-4, atol=1e-3)
            else:
                same = torch.equal(value, theirs[key])  # bitwise
            if not same:
                differ.append(f"{key} at {count}")
    hier.finalize()
    flat.finalize()
    return differ


@pytest.mark.parametrize("layout", ["2x2", "3+1"])
def test_results_equal_flat_gloo_bitwise_for_integers(pool4, layout: str) -> None:
    # 4 Mi int32 (16 MiB) takes the pipelined reduce_scatter path; 1 and 7 elements do not
    # divide by the ranks of a host.
    counts = [1, 7, 4 << 20]
    assert pool4.run(body_against_flat_gloo, layout, counts, "int32", timeout=240) == [[]] * 4


def test_float_results_match_flat_gloo(pool4) -> None:
    counts = [(1 << 20) + 3]
    assert pool4.run(body_against_flat_gloo, "2x2", counts, "float32", timeout=240) == [[]] * 4


def body_point_to_point(layout: str) -> list[float]:
    comm = _hier(layout)
    r, n = comm.get_rank(), comm.get_size()
    got = []
    # Everyone sends to everyone: same-host pairs use the local level, others the global one.
    for peer in range(n):
        if peer == r:
            continue
        outgoing = torch.full((1000,), float(100 * r + peer))
        incoming = torch.empty(1000)
        batch = comm.batch_op_create()
        batch.send(outgoing, peer).recv(incoming, peer)
        batch.issue(async_op=True).wait()
        got.append(float(incoming[0]))
    out = torch.empty(n * 3, dtype=torch.int64)
    comm.all_to_all_single(out, torch.arange(n * 3, dtype=torch.int64) + 10 * r)
    got.extend(float(x) for x in out)
    comm.finalize()
    return got


def test_point_to_point_within_and_across_hosts(pool4) -> None:
    results = pool4.run(body_point_to_point, "3+1", timeout=120)
    for r, got in enumerate(results):
        peers = [p for p in range(4) if p != r]
        assert got[:3] == [float(100 * p + r) for p in peers]
        assert got[3:] == [float(10 * p + 3 * r + k) for p in range(4) for k in range(3)]


# -- levels are ordinary communicators -----------------------------------------------------


def body_levels(layout: str, lazy_global: str | None = None) -> dict[str, Any]:
    lazy = {"hier::lazy_global": lazy_global} if lazy_global else {}
    comm = _hier(layout, more_hints=lazy)
    impl = comm.get_backend_impl()
    levels = impl.levels()
    # Whether each level's engine connected its peers at creation (gloo: not when lazy).
    eager = {role: c.get_backend_impl().init_waits_for_peers() for role, c in levels.items()}
    seen: list[str] = []
    levels["local"].register_pre_hook(lambda name, op_id, args: seen.append(str(name)))
    t = torch.ones(64 << 10)  # 256 KiB: local reduce_scatter + all_gather when hosts are even
    comm.all_reduce(t, torchcomms.ReduceOp.SUM)
    # 8 bytes: recursive doubling between the hosts' leaders (rail 0 or the leaders level),
    # straight into that level's backend unless something observes the level.
    cross = levels.get("leaders", levels.get("rail"))
    rd_ops: list[str] = []
    if cross is not None:
        rd_hook = cross.register_pre_hook(lambda name, op_id, args: rd_ops.append(str(name)))
    tiny = torch.full((2,), float(comm.get_rank() + 1))
    comm.all_reduce(tiny, torchcomms.ReduceOp.SUM)  # through the level: its hook sees it
    if cross is not None:
        rd_hook.remove()
    comm.all_reduce(tiny, torchcomms.ReduceOp.SUM)  # straight into the level's backend
    rd_sums = [float(x) for x in tiny]
    comm.finalize()
    # With flat forced, small messages are one all_reduce on the global level.
    comm = _hier(layout, more_hints={**lazy, "hier::all_reduce_algorithm": "flat"})
    levels = comm.get_backend_impl().levels()
    # An 8-byte all_reduce is one call on the global level: taken by hier's lean entry
    # straight into that level's backend only while nothing observes the level.
    glob: list[str] = []
    handle = levels["global"].register_pre_hook(lambda name, op_id, args: glob.append(str(name)))
    small = torch.full((2,), float(comm.get_rank() + 1))
    comm.all_reduce(small, torchcomms.ReduceOp.SUM)  # through the level: its hook sees it
    handle.remove()
    small_sums = [float(small[0])]
    comm.all_reduce(small, torchcomms.ReduceOp.SUM)  # straight into the level's backend
    small_sums.append(float(small[0]))
    info = {
        "levels": {
            role: (c.get_name(), c.get_backend(), c.get_size()) for role, c in levels.items()
        },
        "local_ops": seen,
        "global_ops": glob,
        "small_sums": small_sums,
        "rd_ops": rd_ops,
        "rd_sums": rd_sums,
        "eager": eager,
        "value": float(t[0]),
    }
    comm.finalize()
    info["finalized"] = [c.is_finalized() for c in levels.values()]
    return info


def test_levels_are_named_communicators_with_their_own_hooks(pool4) -> None:
    infos = pool4.run(body_levels, "2x2", timeout=120)
    for r, info in enumerate(infos):
        name = info["levels"]["global"][0].rsplit(".", 1)[0]
        host = r // 2
        assert info["levels"]["local"] == (f"{name}.local{host}", "gloo", 2)
        assert info["levels"]["rail"] == (f"{name}.rail{r % 2}", "gloo", 2)
        assert info["levels"]["global"][1:] == ("gloo", 4)
        assert "leaders" not in info["levels"]
        assert info["value"] == 4.0
        assert [str(s).rsplit(".", 1)[-1] for s in info["local_ops"]] == [
            "reduce_scatter_single",
            "all_gather_single",
            *(["reduce", "broadcast"] * 2),  # around the two recursive doublings
            "finalize",  # the hier communicator's finalize finalized its level
        ]
        assert [str(s).rsplit(".", 1)[-1] for s in info["global_ops"]] == ["all_reduce"]
        assert info["small_sums"] == [10.0, 40.0]
        assert info["rd_sums"] == [40.0, 40.0]
        if r % 2 == 0:  # a leader: rail 0 carries its exchanges, the hook saw each
            ops = [str(s).rsplit(".", 1)[-1] for s in info["rd_ops"]]
            assert sorted(set(ops)) == ["recv", "send"] and len(ops) == 2, ops
        # The global level connects each pair on first use; the rail at creation.
        assert info["eager"] == {"local": True, "rail": True, "global": False}
        assert all(info["finalized"])
    uneven = pool4.run(body_levels, "3+1", "false", timeout=120)
    assert [("leaders" in i["levels"]) for i in uneven] == [True, False, False, True]
    assert all(i["eager"]["global"] for i in uneven)  # hier::lazy_global=false
    assert all(i["value"] == 4.0 for i in uneven)


def body_mixed_backends() -> list[float]:
    _register_vendor()
    comm = _hier("3+1", {"a": "gloo", "b": "examplevendor"})
    backends = {role: c.get_backend() for role, c in comm.get_backend_impl().levels().items()}
    t = torch.arange(10, dtype=torch.float64) + comm.get_rank()
    comm.all_reduce(t, torchcomms.ReduceOp.SUM)
    sub_name = unique_name("sub")
    sub = comm.split([0, 1, 3] if comm.get_rank() != 2 else [], sub_name)
    if sub is not None:
        s = torch.ones(3)
        sub.all_reduce(s, torchcomms.ReduceOp.SUM)
        sub_levels = sub.get_backend_impl().levels()
        # Every level of the child is a split of the parent's: local of the host's local
        # level, leaders and global of the global level, each keeping its backend.
        expected = {
            "local": (f"{sub_name}.local{0 if comm.get_rank() < 3 else 1}", "gloo"),
            "global": (f"{sub_name}.global", "gloo"),
        }
        if comm.get_rank() in (0, 3):
            expected["leaders"] = (f"{sub_name}.leaders", "gloo")
        if comm.get_rank() == 3:
            expected["local"] = (f"{sub_name}.local1", "examplevendor")
        got = {role: (c.get_name(), c.get_backend()) for role, c in sub_levels.items()}
        backends["sub_sum"] = str(float(s[0])) if got == expected else f"{got} != {expected}"
        sub.finalize()
    comm.finalize()
    return (
        [float(x) for x in t] + [backends["local"] == "examplevendor"] + [backends.get("sub_sum")]
    )


def test_each_host_on_its_own_backend_and_split(pool4) -> None:
    results = pool4.run(body_mixed_backends, timeout=120)
    expected = [float(4 * k + 6) for k in range(10)]
    for r, got in enumerate(results):
        assert got[:10] == expected
        assert got[10] == (r == 3)
        assert got[11] == (None if r == 2 else "3.0")


# -- bad settings fail on every rank, saying what is wrong --------------------------------


def body_settings(which: str) -> tuple[str, str, float]:
    r = current_rank()
    host = LAYOUTS["2x2"][r]
    hints = {"host_id": host, "local_backend": "gloo"}
    if which == "global" and r == 3:
        hints["global_backend"] = "mpi"
    if which == "local" and host == "b":
        hints["local_backend"] = "nosuchengine"
    start = time.monotonic()
    try:
        torchcomms.new_comm("hier", "cpu", name=unique_name("bad"), hints=hints)
    except torchcomms.TorchCommError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "created", "", time.monotonic() - start


def test_global_backend_mismatch_is_an_input_error_on_every_rank(pool4) -> None:
    for kind, message, _ in pool4.run(body_settings, "global", timeout=60):
        assert kind == "CommInputError", message
        assert "'gloo'" in message and "'mpi'" in message


def test_missing_local_backend_fails_its_host_and_names_it_elsewhere(pool4) -> None:
    results = pool4.run(body_settings, "local", timeout=60)
    for r, (kind, message, seconds) in enumerate(results):
        assert "nosuchengine" in message
        if r >= 2:
            assert kind == "BackendNotFoundError", message
        else:
            assert kind == "CommOperationError", message
            assert "host 'b'" in message
        assert seconds < 20  # the status exchange answers at once, not at the 30 s timeout


# -- a peer killed at any level ------------------------------------------------------------


def body_killed_peer(layout: str, victim: int, count: int) -> tuple[str, float]:
    comm = _hier(layout, timeout=timedelta(seconds=KILL_TIMEOUT_S))
    t = torch.ones(count)
    comm.all_reduce(t, torchcomms.ReduceOp.SUM)  # every level connected and working
    if comm.get_rank() == victim:  # dies in the middle of one of the calls below
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()
    deadline = time.monotonic() + 4 * KILL_TIMEOUT_S
    while time.monotonic() < deadline:
        start = time.monotonic()
        try:
            comm.all_reduce(t, torchcomms.ReduceOp.SUM)
            comm.broadcast(t, victim)
        except torchcomms.TorchCommError as exc:
            return type(exc).__name__, time.monotonic() - start
    return "no error", 0.0


@pytest.fixture(scope="module")
def patient_pool() -> Any:
    """Four ranks whose survivors get time to fail on their own after a peer dies."""
    with RankPool(4, grace_s=4 * KILL_TIMEOUT_S) as pool:
        yield pool


@pytest.mark.parametrize(
    ("layout", "victim", "count"),
    # 16 MiB: every level in turn; 8 bytes: hier's lean entry into the global level's backend
    [("2x2", 3, 4 << 20), ("3+1", 1, 4 << 20), ("2x2", 2, 2)],
)
def test_a_killed_peer_fails_the_survivors_within_the_timeout(
    patient_pool: Any, layout: str, victim: int, count: int
) -> None:
    outcomes = patient_pool.run_outcomes(body_killed_peer, layout, victim, count, timeout=120)
    assert outcomes[victim].status == "died"
    for o in outcomes:
        if o.rank == victim:
            continue
        assert o.ok, o.error
        kind, seconds = o.value
        assert kind in ("CommOperationError", "CommTimeoutError"), (o.rank, kind)
        # The failing call ends within its timeout (plus the engine's reaction time).
        assert seconds < KILL_TIMEOUT_S + 4, (o.rank, seconds)

"""Fault tolerance: reconfigure after a real SIGKILL (shrink), a new process joining (grow),
identity and repeated reconfigures, mismatched handles or uuids, unsupported backends.

Handles are exchanged through the pool's rendezvous store, as an application would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch

import torchcomms
from torchcomms import ReduceOp
from torchcomms_core import TorchCommBackend
from torchcomms_core.testing import RankPool, current_rank, unique_name
from torchcomms_gloo.backend import GlooBackend

# Detection of a SIGKILLed peer is immediate (connection reset); the timeout only bounds it.
# It stays a few seconds, but leaves room for a loaded 2-core machine.
TIMEOUT_S = 5.0
MISMATCH_TIMEOUT_S = 30.0


def _store():
    from torch.distributed import TCPStore

    return TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=30),
    )


def _comm(name: str, store=None):
    return torchcomms.new_comm(
        "gloo",
        torch.device("cpu"),
        name=name,
        enable_reconfigure=True,
        timeout=timedelta(seconds=TIMEOUT_S),
        store=store,
    )


def _exchange(store, tag: str, handle: str, rank: int, ranks: list[int]) -> list[str]:
    store.set(f"{tag}/{rank}", handle)
    return [store.get(f"{tag}/{r}").decode() for r in ranks]


def _sum_of_ones(comm) -> float:
    t = torch.ones(8)
    comm.all_reduce(t, ReduceOp.SUM, False)
    return float(t[0])


# -- identity, set order, repeated reconfigure -------------------------------------------


def body_identity_and_repeated() -> dict:
    name = unique_name("ft")
    comm = _comm(name)
    out: dict = {"support": comm.method_support()["reconfigure_engine"]}
    try:
        comm.all_reduce(torch.ones(1), ReduceOp.SUM, False)
        out["unbound"] = None
    except torchcomms.CommStateError as exc:
        out["unbound"] = str(exc)
    r, n = current_rank(), int(os.environ["TORCHCOMM_SIZE"])
    handle = comm.get_init_handle()
    handles = _exchange(_store(), name, handle, r, list(range(n)))
    work = comm.reconfigure(1, handles)
    out["completed"] = work.is_completed()
    out["as_list"] = (comm.get_rank(), comm.get_size(), _sum_of_ones(comm))
    comm.reconfigure("second", set(handles))
    out["as_set"] = (comm.get_rank(), sorted(handles).index(handle), _sum_of_ones(comm))
    comm.reconfigure(3, list(reversed(handles)), timedelta(seconds=TIMEOUT_S))
    t = torch.tensor([float(r)])
    comm.broadcast(t, 0, False)  # rank 0 is now the last pool rank
    out["reversed"] = (comm.get_rank(), float(t[0]))
    try:
        comm.reconfigure(1, handles)
        out["reused"] = None
    except torchcomms.CommInputError as exc:
        out["reused"] = str(exc)
    comm.finalize()
    return out


def test_identity_set_and_repeated_reconfigure(pool4: RankPool) -> None:
    results = pool4.run(body_identity_and_repeated, timeout=60)
    n = pool4.world_size
    for r, res in enumerate(results):
        assert res["support"] == "native"
        assert "call comm.reconfigure(uuid, init_handles) first" in res["unbound"]
        assert res["completed"] is True
        assert res["as_list"] == (r, n, float(n))
        rank, expected, total = res["as_set"]
        assert rank == expected and total == n
        assert res["reversed"] == (n - 1 - r, float(n - 1))
        assert "already used" in res["reused"]
    assert sorted(res["as_set"][0] for res in results) == list(range(n))


# -- mismatched handle lists and uuids -----------------------------------------------------


def body_mismatch() -> dict:
    name = unique_name("ft")
    comm = _comm(name)
    r, n = current_rank(), int(os.environ["TORCHCOMM_SIZE"])
    # One store client for the whole body: connecting a new one while a peer polls in
    # reconfigure can take seconds on a loaded machine, longer than the rounds' timeout.
    store = _store()
    handles = _exchange(store, name, comm.get_init_handle(), r, list(range(n)))
    out = {}
    # Rank 0 swaps two members: every rank must refuse, none may hang.
    mine = list(handles)
    if r == 0:
        mine[1], mine[2] = mine[2], mine[1]
    for what, uuid, lst in (
        ("lists", "m1", mine),
        ("uuids", "m2-x" if r == 0 else "m2-y", handles),
    ):
        start = time.monotonic()
        try:
            # A timeout well above what a loaded machine takes to gather four members:
            # the mismatch must be found before it, not by it.
            comm.reconfigure(uuid, lst, timedelta(seconds=MISMATCH_TIMEOUT_S))
            out[what] = ("no error", 0.0)
        except torchcomms.TorchCommError as exc:
            out[what] = (f"{type(exc).__name__}: {exc}", time.monotonic() - start)
        store.set(f"{name}/done-{what}/{r}", "1")  # keep the rounds apart
        for p in range(n):
            store.get(f"{name}/done-{what}/{p}")
    # A consistent reconfigure afterwards works.
    comm.reconfigure("m3", handles)
    out["after"] = _sum_of_ones(comm)
    comm.finalize()
    return out


def test_mismatched_handles_or_uuids_fail_fast_on_every_member(pool4: RankPool) -> None:
    results = pool4.run(body_mismatch, timeout=60)
    for res in results:
        # Seen as a mismatch (CommInputError), not found out by the timeout.
        err, seconds = res["lists"]
        assert err.startswith("CommInputError") and "disagree on init_handles" in err, results
        assert seconds < MISMATCH_TIMEOUT_S, res
        err, seconds = res["uuids"]
        assert err.startswith("CommInputError") and "same uuid" in err, results
        assert seconds < MISMATCH_TIMEOUT_S, res
        assert res["after"] == pool4.world_size


def body_missing_member() -> dict:
    name = unique_name("ft")
    comm = _comm(name)
    r, n = current_rank(), int(os.environ["TORCHCOMM_SIZE"])
    handles = _exchange(_store(), name, comm.get_init_handle(), r, list(range(n)))
    if r == n - 1:  # alive, but never calls reconfigure
        time.sleep(4)
        comm.finalize()
        return {"skipped": True}
    start = time.monotonic()
    out: dict = {"error": None}
    try:
        comm.reconfigure("lonely", handles, timedelta(seconds=1.5))
    except torchcomms.CommTimeoutError as exc:
        out = {"error": str(exc), "seconds": time.monotonic() - start}
    # Rank 0's communicator hosts the rendezvous the others wait in: keep it until they
    # have timed out too (a member that leaves it is a different failure, tested apart).
    time.sleep(2)
    comm.finalize()
    return out


def test_absent_member_times_out(pool4: RankPool) -> None:
    results = pool4.run(body_missing_member, timeout=60)
    for res in results[:-1]:
        assert "1 of 4 members did not join uuid 'lonely'" in res["error"], res
        assert 1.4 < res["seconds"] < 4, res


# -- backends without the capability ---------------------------------------------------


class NoReconfigureGloo(GlooBackend):
    """Gloo without the reconfigure capability, as a vendor backend might be."""

    reconfigure_engine = TorchCommBackend.reconfigure_engine


def body_unsupported() -> dict:
    torchcomms.register_backend("gloo_noreconf", NoReconfigureGloo)
    out = {}
    try:
        torchcomms.new_comm("gloo_noreconf", "cpu", name=unique_name("ft"), enable_reconfigure=True)
        out["new_comm"] = None
    except RuntimeError as exc:
        out["new_comm"] = str(exc)
    comm = torchcomms.new_comm(
        "gloo_noreconf", "cpu", name=unique_name("ft"), timeout=timedelta(seconds=TIMEOUT_S)
    )
    out["support"] = comm.method_support()["reconfigure_engine"]
    try:
        comm.reconfigure(1, [comm.get_init_handle()])
        out["reconfigure"] = None
    except RuntimeError as exc:
        out["reconfigure"] = str(exc)
    comm.finalize()
    plain = torchcomms.new_comm(
        "gloo", "cpu", name=unique_name("ft"), timeout=timedelta(seconds=TIMEOUT_S)
    )
    try:
        plain.reconfigure(1, [plain.get_init_handle()])
        out["plain"] = None
    except torchcomms.CommStateError as exc:
        out["plain"] = str(exc)
    plain.finalize()
    return out


def test_unsupported_backend_raises(pool4: RankPool) -> None:
    for res in pool4.run(body_unsupported, timeout=60):
        assert "reconfigure not implemented" in res["new_comm"]
        assert res["support"] == "unsupported"
        assert "reconfigure not implemented" in res["reconfigure"]
        assert "enable_reconfigure=True" in res["plain"]


# -- shrink after SIGKILL (3 ranks) ----------------------------------------------------------


def _train_until_failure(comm, victim: int, kill_at: int) -> dict:
    t = torch.ones(256)
    last_ok = time.monotonic()
    for i in range(1000):
        if comm.get_rank() == victim and i == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            comm.all_reduce(t, ReduceOp.SUM, False)
            t.fill_(1)
            last_ok = time.monotonic()
        except torchcomms.TorchCommError as exc:
            return {
                "iteration": i,
                "detect_s": time.monotonic() - last_ok,
                "error": type(exc).__name__,
            }
    return {"iteration": -1}


def _ddp_grad(pg, rank: int) -> list[float]:
    """One DDP backward over ``pg``: the gradient averaged over the group's members."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1, bias=False), process_group=pg)
    model(torch.full((1, 4), float(rank + 1))).sum().backward()
    return model.module.weight.grad[0].tolist()


def body_shrink(victim: int) -> dict:
    from torchcomms.elastic import rebuild_process_group

    name = unique_name("ft")
    comm = _comm(name)
    store = _store()
    r, n = current_rank(), int(os.environ["TORCHCOMM_SIZE"])
    handles = _exchange(store, name, comm.get_init_handle(), r, list(range(n)))
    comm.reconfigure("full", handles)
    out = {"ddp_before": _ddp_grad(rebuild_process_group(comm), comm.get_rank())}
    out.update(_train_until_failure(comm, victim, kill_at=5))
    start = time.monotonic()
    survivors = [h for i, h in enumerate(handles) if i != victim]
    comm.reconfigure("shrunk", survivors)
    out["sum"] = _sum_of_ones(comm)
    out["recover_s"] = time.monotonic() - start
    out["rank_size"] = (comm.get_rank(), comm.get_size())
    # The PyTorch bridge: a new process group over the reconfigured communicator.
    pg = rebuild_process_group(comm)
    out["pg"] = (pg.rank(), pg.size())
    out["ddp_after"] = _ddp_grad(pg, comm.get_rank())
    import torch.distributed as dist

    dist.destroy_process_group()
    out["finalized_with_group"] = comm.is_finalized()
    return out


@pytest.fixture(scope="module")
def pool3():
    with RankPool(3, comm_timeout_s=TIMEOUT_S) as pool:
        yield pool


def test_shrink_after_sigkill_3_ranks(pool3: RankPool) -> None:
    victim = 1
    outcomes = pool3.run_outcomes(body_shrink, victim, timeout=90)
    assert outcomes[victim].status == "died", outcomes[victim].error
    for r in (0, 2):
        res = outcomes[r].value
        assert outcomes[r].ok, outcomes[r].error
        assert res["iteration"] == 5
        assert res["detect_s"] < TIMEOUT_S + 2, res
        assert res["sum"] == 2.0
        assert res["rank_size"] == ([0, None, 1][r], 2)
        assert res["recover_s"] < 2 + TIMEOUT_S, res
        assert res["ddp_before"] == [2.0] * 4  # mean of inputs 1, 2, 3
        assert res["pg"] == res["rank_size"]
        assert res["ddp_after"] == [1.5] * 4  # new ranks 0 and 1: mean of inputs 1, 2
        assert res["finalized_with_group"]


# -- shrink, then grow with a replacement process (4 ranks) ----------------------------------

_REPLACEMENT = """
import os, sys, torch, torchcomms
from datetime import timedelta
from torch.distributed import TCPStore
name = sys.argv[1]
store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
comm = torchcomms.new_comm("gloo", "cpu", name=name, enable_reconfigure=True,
                           timeout=timedelta(seconds=30), store=store)
store.set(name + "/joiner", comm.get_init_handle())
handles = store.get(name + "/grown").decode().split(",")
comm.reconfigure("grown", handles)
t = torch.ones(8)
comm.all_reduce(t, torchcomms.ReduceOp.SUM, False)
w = torch.zeros(4)
comm.broadcast(w, 0, False)
store.set(name + "/joiner-result", f"{comm.get_rank()},{comm.get_size()},{t[0]},{w.sum()}")
comm.finalize()
"""


def body_shrink_then_grow(victim: int) -> dict:
    name = unique_name("ft")
    store = _store()  # the replacement passes the same store explicitly
    comm = _comm(name, store)
    r, n = current_rank(), int(os.environ["TORCHCOMM_SIZE"])
    handles = _exchange(store, name, comm.get_init_handle(), r, list(range(n)))
    proc = None
    if r == 0:
        # A fresh process outside the launcher (no rank in its environment), started now
        # so that its imports overlap the training; it joins once the group has shrunk.
        env = {k: v for k, v in os.environ.items() if k not in ("TORCHCOMM_RANK", "TORCHCOMM_SIZE")}
        proc = subprocess.Popen([sys.executable, "-c", _REPLACEMENT, name], env=env)
    comm.reconfigure("full", handles)
    out = _train_until_failure(comm, victim, kill_at=3)
    survivors = [h for i, h in enumerate(handles) if i != victim]
    comm.reconfigure("shrunk", survivors)
    out["shrunk"] = (comm.get_size(), _sum_of_ones(comm))
    joiner = store.get(f"{name}/joiner").decode()
    grown = [*survivors, joiner]
    if comm.get_rank() == 0:
        store.set(f"{name}/grown", ",".join(grown))
    comm.reconfigure("grown", grown, timedelta(seconds=30))
    out["grown"] = (comm.get_rank(), comm.get_size(), _sum_of_ones(comm))
    w = torch.arange(4.0) if comm.get_rank() == 0 else torch.zeros(4)
    comm.broadcast(w, 0, False)
    if proc is not None:
        out["joiner_exit"] = proc.wait(60)
        out["joiner"] = store.get(f"{name}/joiner-result").decode()
    comm.finalize()
    return out


def test_shrink_then_grow_after_sigkill_4_ranks(pool4: RankPool) -> None:
    victim = 2
    grace, pool4.grace_s = pool4.grace_s, 60.0  # survivors go on after the death
    try:
        outcomes = pool4.run_outcomes(body_shrink_then_grow, victim, timeout=90)
    finally:
        pool4.grace_s = grace
    assert outcomes[victim].status == "died", outcomes[victim].error
    survivors = [o for o in outcomes if o.rank != victim]
    for o in survivors:
        assert o.ok, o.error
        res = o.value
        assert res["iteration"] == 3 and res["detect_s"] < TIMEOUT_S + 2, res
        assert res["shrunk"] == (3, 3.0)
        assert res["grown"][1:] == (4, 4.0)
    assert sorted(o.value["grown"][0] for o in survivors) == [0, 1, 2]
    res0 = outcomes[0].value
    assert res0["joiner_exit"] == 0
    assert res0["joiner"] == "3,4,4.0,6.0"


# -- the elastic training example -------------------------------------------------------------


def test_elastic_training_example_survives_sigkill_and_rejoin(tmp_path) -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "elastic.json"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(root, "examples", "elastic_training.py"),
            "--steps",
            "16",
            "--kill-at",
            "5",
            "--rejoin-at",
            "7",
            "--after-rejoin",
            "3",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    res = json.loads(out.read_text())
    assert res["victim_exit"] == -signal.SIGKILL
    assert res["missing_steps"] == [] and res["loss_disagreements"] == 0
    assert res["max_loss_error"] < 1e-4  # equals the single-process run: no step lost/doubled
    sizes = [t["size"] for t in res["trace"]]
    kill = sizes.index(3)
    assert set(sizes[:kill]) == {4} and 3 not in sizes[sizes.index(4, kill) :], sizes
    reasons = [(r["reason"], r["size"]) for r in res["recoveries"]]
    assert ("failure", 3) in reasons and ("grow", 4) in reasons, reasons
    assert all(r["identical"] for r in res["recoveries"])
    assert res["recover_s"] < 2 + 2.0, res["recover_s"]  # goal: 2 s + detection timeout

"""Reconfigure in a store that outlives its communicators, as the reference's own tests use it.

One store shared by every communicator of a job: later communicators reuse the uuids of
earlier ones (each attempt keys its entries by uuid and handle list, so they never meet),
disjoint groups reconfigure with the same uuid at once, members reconfigure back to back
(solo, all, solo: none may retire its engine while a peer still connects to it), a list
that shares members with another list under one uuid is still a disagreement, and a c10d
group over a reconfigured communicator follows it or refuses clearly. The self-hosted
rendezvous listens on the one address its handle names.
"""

from __future__ import annotations

import os
import socket
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import torch

import torchcomms
from torchcomms import ReduceOp
from torchcomms_core.creation.rendezvous import default_address, parse_handle
from torchcomms_core.testing import RankPool, current_rank, unique_name

SETUP = timedelta(seconds=30)


def _store():
    from torch.distributed import TCPStore

    return TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=60),
    )


def _new(name: str, store) -> torchcomms.TorchComm:
    return torchcomms.new_comm(
        "gloo", "cpu", name=name, enable_reconfigure=True, store=store, timeout=SETUP
    )


def _sum(comm, value: float) -> float:
    t = torch.full((1024,), value)
    comm.all_reduce(t, ReduceOp.SUM, False)
    return float(t[0])


def _exchange(store, tag: str, handle: str, n: int) -> list[str]:
    store.set(f"{tag}/{current_rank()}", handle)
    return [store.get(f"{tag}/{r}").decode() for r in range(n)]


# -- uuids reused in one store ---------------------------------------------------------------


def body_reuse(tag: str) -> dict:
    r, n = current_rank(), int(os.environ["TORCHCOMM_SIZE"])
    store = _store()  # one store for every communicator, the same keys each time
    out: dict = {}
    # Three communicators in sequence, each first alone, then with everyone, then alone
    # again, with the same uuids each time: every rank's solo group is a disjoint group
    # using the same uuid at the same moment, and each later communicator meets the
    # earlier ones' keys.
    for round_ in range(3):
        comm = _new(f"{tag}-{round_}", store)
        comm.reconfigure(3, [comm.get_init_handle()], SETUP)
        solo = (comm.get_rank(), comm.get_size(), _sum(comm, r + 1.0))
        handles = _exchange(store, f"{tag}/{round_}", comm.get_init_handle(), n)
        comm.reconfigure(4, handles, SETUP)
        everyone = (comm.get_rank(), comm.get_size(), _sum(comm, r + 1.0))
        comm.reconfigure(5, [comm.get_init_handle()], SETUP)
        out[round_] = (solo, everyone, (comm.get_rank(), comm.get_size()))
        comm.finalize()
    # A list that shares members with another list under one uuid is still a disagreement,
    # although earlier communicators left lists under that uuid.
    comm = _new(f"{tag}-mismatch", store)
    handles = _exchange(store, f"{tag}/mismatch", comm.get_init_handle(), n)
    mine = list(reversed(handles)) if r == n - 1 else handles  # same members, other order
    try:
        comm.reconfigure(4, mine, SETUP)
        out["mismatch"] = None
    except torchcomms.CommInputError as exc:
        out["mismatch"] = str(exc)
    comm.reconfigure(6, handles, SETUP)  # and the communicator stays usable
    out["after"] = _sum(comm, 1.0)
    comm.finalize()
    return out


@pytest.mark.parametrize("ranks", [2, 4])
def test_communicators_reusing_uuids_in_one_store(ranks: int, pool2: RankPool, pool4) -> None:
    pool = pool2 if ranks == 2 else pool4
    results = pool.run(body_reuse, unique_name("reuse"), timeout=240)
    n = pool.world_size
    total = float(sum(range(1, n + 1)))
    for r, res in enumerate(results):
        for round_ in range(3):
            solo, everyone, last = res[round_]
            assert solo == (0, 1, r + 1.0), res
            assert everyone == (r, n, total), res
            assert last == (0, 1), res
        assert "disagree on init_handles for uuid '4'" in res["mismatch"], res
        assert res["after"] == float(n)


# -- back to back, threads of one process ---------------------------------------------------------


def test_back_to_back_reconfigures_never_cut_a_peer_off() -> None:
    """All, solo, all, solo...: a member that returns first and retires the engine at once
    must not close connections a slower member is still setting up."""
    n, rounds = 4, 6
    comms = [
        torchcomms.new_comm("gloo", "cpu", name="b2b", enable_reconfigure=True, timeout=SETUP)
        for _ in range(n)
    ]
    handles = [c.get_init_handle() for c in comms]
    errors: list[BaseException] = []
    sums: dict[tuple[int, int], float] = {}

    def member(i: int) -> None:
        c = comms[i]
        try:
            for k in range(rounds):
                c.reconfigure(f"all{k}", handles, SETUP)
                sums[(k, i)] = float(c.get_size())
                c.reconfigure(f"solo{k}", [handles[i]], SETUP)
            c.reconfigure("last", handles, SETUP)
            sums[(rounds, i)] = _sum(c, 1.0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert sums == {(k, i): float(n) for k in range(rounds + 1) for i in range(n)}
    for c in comms:
        c.finalize()


# -- a c10d group over a reconfigured communicator ----------------------------------------------


def body_wrapper(tag: str) -> dict:
    from torchcomms._comms import _BackendWrapper

    r, n = current_rank(), int(os.environ["TORCHCOMM_SIZE"])
    store = _store()
    comm = _new(tag, store)
    handles = _exchange(store, tag, comm.get_init_handle(), n)
    comm.reconfigure(1, handles, SETUP)
    pg = _BackendWrapper(comm)
    out: dict = {}

    def c10d_sum() -> float:
        t = torch.full((4096,), r + 1.0)
        pg.allreduce([t]).wait()
        return float(t[0])

    out["before"] = c10d_sum()
    comm.reconfigure(2, handles, SETUP)  # same members: the group takes the new engine
    out["same"] = c10d_sum()
    comm.reconfigure(3, list(reversed(handles)), SETUP)  # ranks renumbered: stale
    try:
        c10d_sum()
        out["renumbered"] = None
    except torchcomms.CommStateError as exc:
        out["renumbered"] = str(exc)
    out["comm"] = _sum(comm, 1.0)  # the communicator itself runs on
    comm.finalize()
    return out


def test_c10d_group_follows_reconfigure_or_refuses(pool2: RankPool) -> None:
    results = pool2.run(body_wrapper, unique_name("wrap"), timeout=120)
    for res in results:
        assert res["before"] == 3.0 and res["same"] == 3.0, res
        assert "rebuild_process_group" in res["renumbered"], res
        assert "was reconfigured to rank" in res["renumbered"], res
        assert res["comm"] == 2.0


# -- where the self-hosted rendezvous listens -----------------------------------------------------


def _listening(port: int) -> list[str]:
    """Local addresses with a TCP socket listening on ``port`` (Linux /proc)."""
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            addr, port_hex = fields[1].split(":")
            if fields[3] != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(addr)
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.append(socket.inet_ntop(family, raw))
    return sorted(found)


def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def _other_addresses(bound: str) -> list[str]:
    """Addresses of this host other than ``bound``: another loopback address (every one of
    127/8 is this host's on Linux) and each interface's IPv4 address."""
    from torchcomms_gloo.interface import interface_address

    others = {"127.0.0.2" if bound != "127.0.0.2" else "127.0.0.1"}
    for _, name in socket.if_nameindex():
        try:
            others.add(interface_address(name))
        except Exception:
            continue  # no IPv4 address there
    others.discard(bound)
    return sorted(others)


@pytest.mark.parametrize("hints", [None, {"hostname": "127.0.0.2"}])
def test_the_hosted_rendezvous_listens_only_on_the_advertised_address(hints) -> None:
    comm = torchcomms.new_comm(
        "gloo", "cpu", name=unique_name("listen"), enable_reconfigure=True, hints=hints
    )
    try:
        handle = parse_handle(comm.get_init_handle(), "gloo", True, "handle")
        assert handle.host is not None
        expected = default_address() if hints is None else "127.0.0.2"
        assert handle.host == expected
        assert _listening(handle.port) == [expected]  # never 0.0.0.0 or ::
        others = _other_addresses(expected)
        assert others
        for other in others:
            assert _refused(other, handle.port), other
        socket.create_connection((handle.host, handle.port), timeout=5).close()
        comm.reconfigure(1, [comm.get_init_handle()], SETUP)  # and it works there
        assert _sum(comm, 2.0) == 2.0
    finally:
        comm.finalize()

"""The rendezvous store other users could reach: it must listen only where ``MASTER_ADDR``
points, and a purely local launch must not listen on the network at all.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import warnings
from pathlib import Path

import pytest
import torch

import torchcomms
from torchcomms_core.bench.launch import free_port, launch
from torchcomms_core.creation import bootstrap
from torchcomms_core.foundation.errors import BootstrapError
from torchcomms_core.testing import unique_name


def _all_reduce(comm) -> float:
    t = torch.ones(1)
    comm.all_reduce(t, torchcomms.ReduceOp.SUM)
    return t.item()


# -- the rendezvous store ----------------------------------------------------------------


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
            # The kernel prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.append(socket.inet_ntop(family, raw))
    return sorted(found)


def body_rank0_hosts_the_store(port: int) -> dict:
    keys = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")
    saved = {k: os.environ.pop(k, None) for k in keys}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        comm = torchcomms.new_comm("gloo", "cpu", name=unique_name("bound"))
        out = {"sum": _all_reduce(comm), "listening": _listening(port)}
        _all_reduce(comm)  # every rank has looked before rank 0 lets go of the store
        comm.finalize()
        bootstrap._stores.pop(("127.0.0.1", port), None)
        return out
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def test_the_store_listens_only_on_master_addr(pool2) -> None:
    port = free_port()
    host, _ = pool2.run(body_rank0_hosts_the_store, port, timeout=60)
    assert host["sum"] == 2.0
    assert host["listening"] == ["127.0.0.1"]


def test_store_listen_address_choices(monkeypatch) -> None:
    port = free_port()
    monkeypatch.delenv("TORCHCOMM_STORE_LISTEN_ADDR", raising=False)
    fd = bootstrap._listen_fd("127.0.0.1", port)
    assert fd is not None and _listening(port) == ["127.0.0.1"]
    os.close(fd)
    # An address this host does not have: every interface, with a warning saying what to set.
    with pytest.warns(RuntimeWarning, match="TORCHCOMM_STORE_LISTEN_ADDR to the address"):
        assert bootstrap._listen_fd("192.0.2.1", port) is None
    monkeypatch.setenv("TORCHCOMM_STORE_LISTEN_ADDR", "*")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert bootstrap._listen_fd("127.0.0.1", port) is None
    monkeypatch.setenv("TORCHCOMM_STORE_LISTEN_ADDR", "192.0.2.1")
    with pytest.raises(BootstrapError, match="cannot listen on TORCHCOMM_STORE_LISTEN_ADDR"):
        bootstrap._listen_fd("127.0.0.1", port)


def local_rank_report(report_dir: str) -> int:
    """A rank of a ``launch``ed job: say how it rendezvoused."""
    from torch.distributed import FileStore

    comm = torchcomms.new_comm("gloo", "cpu", name="launched")
    total = _all_reduce(comm)
    path = os.environ.get("TORCHCOMM_STORE_PATH", "")
    (store,) = bootstrap._stores.values()
    folder = os.path.dirname(path)
    report = {
        "sum": total,
        "file_store": isinstance(store.underlying_store, FileStore),
        "folder": folder,
        "folder_mode": stat.S_IMODE(os.stat(folder).st_mode) if folder else None,
        "master": [os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")],
    }
    _all_reduce(comm)
    comm.finalize()
    with open(os.path.join(report_dir, f"rank{comm.get_rank()}.json"), "w") as f:
        json.dump(report, f)
    return 0


def test_a_local_launch_rendezvouses_through_a_private_file(tmp_path: Path) -> None:
    assert launch(2, local_rank_report, (str(tmp_path),)) == 0
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for report in reports:
        assert report["sum"] == 2.0
        assert report["file_store"] and report["master"] == [None, None]
        assert report["folder_mode"] == 0o700
    assert reports[0]["folder"] == reports[1]["folder"]
    assert not os.path.exists(reports[0]["folder"])  # removed when the job ends


def test_a_hosted_store_starts_with_time_to_spare_then_waits_for_the_callers_timeout() -> None:
    """The server's own client may take longer than a short communicator timeout to
    connect on a loaded machine; the store's operations still wait only that timeout."""
    import time
    from datetime import timedelta

    from torchcomms_core.creation import rendezvous as _rendezvous

    assert timedelta(seconds=1) < _rendezvous.HOST_START_FLOOR
    for address in (None, "127.0.0.1"):
        store, _host, _port = _rendezvous.host_store(address, timedelta(seconds=1))
        start = time.monotonic()
        with pytest.raises(Exception, match="(?i)timeout|timed out"):
            store.get("never-set")
        assert 0.9 < time.monotonic() - start < 10

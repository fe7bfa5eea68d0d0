"""The control plane at scale: store operations per rank that do not grow with the world.

Counted, not timed: every rank's store is a ``CountingStore`` over a real ``TCPStore``
client, and the engines are real gloo ones. Two and four rank processes must cost each
rank the same number of store operations, with keys of the same length; sixteen ranks
played by threads of one process (``simulated_rank``) must cost the same again.
``benchmarks/scale.py`` prints the same figures up to thousands of ranks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import pytest
import torch

import torchcomms
from torchcomms_core.testing import (
    CountingStore,
    RankPool,
    current_rank,
    simulated_rank,
    unique_name,
)

LAZY = {"lazy": "true"}


def _client() -> CountingStore:
    from torch.distributed import TCPStore

    return CountingStore(
        TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            None,
            False,
            timedelta(seconds=60),
            wait_for_workers=False,
        )
    )


def _steps(store: CountingStore, rank: int, size: int, tag: str) -> dict[str, tuple[int, int]]:
    """new_comm, split into pairs, split of all, one all_reduce: (ops, longest key) each."""
    out: dict[str, tuple[int, int]] = {}

    def step(name: str, fn):  # type: ignore[no-untyped-def]
        before = store.snapshot()
        store.reset_longest()
        result = fn()
        after = store.snapshot()
        out[name] = ((after - before).total, after.longest_key)
        return result

    world = step(
        "new_comm",
        lambda: torchcomms.new_comm("gloo", "cpu", store=store, name=f"w{tag}", hints=LAZY),
    )
    pair = step("split/2", lambda: world.split([rank // 2 * 2, rank // 2 * 2 + 1], "pairs"))
    every = step("split/all", lambda: world.split(list(range(size)), "all"))
    t = torch.ones(2)
    every.all_reduce(t, torchcomms.ReduceOp.SUM)
    assert float(t[0]) == size
    for c in (every, pair, world):
        c.finalize()
    return out


def body_counts(tag: str) -> dict[str, tuple[int, int]]:
    return _steps(_client(), current_rank(), int(os.environ["TORCHCOMM_SIZE"]), tag)


def _threads(n: int, tag: str, port: int) -> list[dict[str, tuple[int, int]]]:
    from torch.distributed import TCPStore

    stores = [
        CountingStore(TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60), False))
        for _ in range(n)
    ]
    results: list[dict[str, tuple[int, int]]] = [{} for _ in range(n)]
    errors: list[BaseException] = []

    def body(r: int) -> None:
        try:
            with simulated_rank(r, n):
                results[r] = _steps(stores[r], r, n, tag)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return results


def test_store_operations_per_rank_do_not_grow_with_the_world() -> None:
    from torch.distributed import TCPStore

    figures = {}
    for n in (2, 4):
        with RankPool(n) as pool:
            figures[n] = pool.run(body_counts, "scale")  # fresh stores: the name is free
    server = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)
    previous = os.environ.get("TORCH_GLOO_LAZY_INIT")
    os.environ["TORCH_GLOO_LAZY_INIT"] = "1"  # threads build engines: nothing to switch
    try:
        figures[16] = _threads(16, "scale", int(server.port))
    finally:
        if previous is None:
            os.environ.pop("TORCH_GLOO_LAZY_INIT")
        else:
            os.environ["TORCH_GLOO_LAZY_INIT"] = previous
    reference = figures[2][0]
    for n, ranks in figures.items():
        for r, steps in enumerate(ranks):
            # The same operations on every rank of every size, and keys as long (a rank
            # of two digits adds one character to a per-rank key).
            for step, (ops, longest) in steps.items():
                assert ops == reference[step][0], (n, r, steps, reference)
                assert longest <= reference[step][1] + 1, (n, r, steps, reference)
    ops = reference["new_comm"][0] + reference["split/2"][0]
    assert ops <= 10, reference


def body_absent_rank(tag: str) -> str:
    if current_rank() == 3:
        time.sleep(4)  # alive, but never creates the communicator
        return ""
    try:
        torchcomms.new_comm("gloo", "cpu", name=tag, hints=LAZY, timeout=timedelta(seconds=2))
    except torchcomms.CommTimeoutError as exc:
        return str(exc)
    return "no error"


def test_a_lazy_new_comm_still_names_the_rank_that_never_came(pool4: RankPool) -> None:
    for message in pool4.run(body_absent_rank, unique_name("absent"), timeout=60)[:3]:
        assert "only 3 of 4 ranks arrived" in message, message
        assert "ranks [3] never started" in message, message


def body_lazy_default(limit: str) -> tuple[bool, float]:
    saved = {k: os.environ.pop(k, None) for k in ("TORCH_GLOO_LAZY_INIT",)}
    os.environ["TORCHCOMM_GLOO_LAZY_ABOVE"] = limit
    try:
        comm = torchcomms.new_comm("gloo", "cpu", name=unique_name("auto"))
        lazy = not comm.get_backend_impl().init_waits_for_peers()
        t = torch.ones(1)
        comm.all_reduce(t, torchcomms.ReduceOp.SUM)
        comm.finalize()
        return lazy, float(t[0])
    finally:
        os.environ.pop("TORCHCOMM_GLOO_LAZY_ABOVE")
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v


def test_gloo_connects_lazily_above_a_size(pool4: RankPool) -> None:
    assert pool4.run(body_lazy_default, "3") == [(True, 4.0)] * 4
    assert pool4.run(body_lazy_default, "4") == [(False, 4.0)] * 4


def test_lazy_hint_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchcomms_gloo import hints

    monkeypatch.delenv("TORCH_GLOO_LAZY_INIT", raising=False)
    monkeypatch.delenv("TORCHCOMM_GLOO_LAZY_ABOVE", raising=False)
    assert hints.check({}, 64) is False and hints.check({}, 65) is True
    assert hints.check({"lazy": "false"}, 10_000) is False
    monkeypatch.setenv("TORCH_GLOO_LAZY_INIT", "1")  # torch's own switch, set by the user
    assert hints.check({}, 2) is True and hints.check({"lazy": "false"}, 2) is False
    monkeypatch.delenv("TORCH_GLOO_LAZY_INIT")
    monkeypatch.setenv("TORCHCOMM_GLOO_LAZY_ABOVE", "many")
    with pytest.raises(torchcomms.CommInputError, match="TORCHCOMM_GLOO_LAZY_ABOVE='many'"):
        hints.check({}, 2)


def test_split_keys_have_a_fixed_length() -> None:
    from torchcomms_core.creation.join import members_key

    keys = {members_key(list(range(k, k + n))) for n in (2, 1000, 100_000) for k in (0, 7)}
    assert len(keys) == 6  # distinct lists, distinct keys
    assert {len(k) for k in keys} <= {18, 21, 23}  # "<size>x" and 16 hex digits
    assert members_key([]) == "none"


def test_a_split_of_a_hundred_thousand_ranks_is_checked() -> None:
    from torchcomms_core.engines import fake

    comm = torchcomms.new_comm(
        "fake",
        "cpu",
        name=unique_name("big"),
        hints={fake.RANK_HINT: "5", fake.SIZE_HINT: "100000"},
    )
    ranks = list(range(100_000))
    child = comm.split(ranks, unique_name("all"))
    assert child is not None and child.get_size() == 100_000 and child.get_rank() == 5
    # The duplicate check is linear (it was quadratic: 77 s here) and the errors quote the
    # list by its length, not whole (it was 690 kB of message).
    with pytest.raises(torchcomms.CommInputError, match=r"duplicates \[7\]") as dup:
        comm.split([*ranks, 7], unique_name("dup"))
    with pytest.raises(torchcomms.CommInputError, match="do not include this rank") as out:
        comm.split(ranks[6:], unique_name("without"))
    assert "(100001 ranks)" in str(dup.value) and "(99994 ranks)" in str(out.value)
    assert len(str(dup.value)) < 300 and len(str(out.value)) < 300


def test_a_store_host_past_its_open_file_limit_says_ulimit() -> None:
    script = textwrap.dedent(
        """
        import resource, os, socket
        import torchcomms
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                          TORCHCOMM_RANK="0", TORCHCOMM_SIZE="100000")
        try:
            torchcomms.new_comm("gloo", "cpu", name="big")
        except torchcomms.BootstrapError as exc:
            print(exc)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "TORCHCOMM_"))}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert "ulimit -n 100064" in done.stdout, (done.stdout, done.stderr)
    assert "100000 ranks" in done.stdout and "only 256 files" in done.stdout, done.stdout

"""The transport API on NIXL: real processes (2 and 4 ranks) writing and reading each other's
registered memory, refusals before any byte moves, a dying peer, and the process's own
registrations (loopback, in the test process).

Skipped, with the reason, where the NIXL wheel cannot load.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import time
from datetime import timedelta

import pytest
import torch

import torchcomms
from torchcomms._transport import RdmaMemory, RdmaRemoteBuffer, RdmaTransport
from torchcomms_core.testing import RankPool
from torchcomms_core.testing.pool import unique_name

try:
    from torchcomms_nixl import NixlTransport

    REASON = NixlTransport.is_available()[1] if not NixlTransport.is_available()[0] else None
except ImportError as exc:  # the plugin itself is not installed
    REASON = f"torchcomms-nixl is not installed ({exc})"

pytestmark = pytest.mark.skipif(REASON is not None, reason=f"NIXL: {REASON}")

CPU = torch.device("cpu")


# -- helpers run on every rank -------------------------------------------------------------


def _exchange(comm, payload: bytes) -> list[bytes]:
    """Every rank's ``payload``, through the communicator."""
    n = comm.get_size()
    lengths = torch.empty(n, dtype=torch.int64)
    comm.all_gather_single(lengths, torch.tensor([len(payload)], dtype=torch.int64))
    width = max(int(lengths.max()), 1)
    mine = torch.zeros(width, dtype=torch.uint8)
    mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    every = torch.empty(n * width, dtype=torch.uint8)
    comm.all_gather_single(every, mine)
    return [every[r * width : r * width + int(lengths[r])].numpy().tobytes() for r in range(n)]


def _mesh(comm, timeout: timedelta | None = None) -> dict[int, RdmaTransport]:
    """One connected transport to every other rank."""
    r, n = comm.get_rank(), comm.get_size()
    transports = {p: RdmaTransport(CPU, timeout=timeout) for p in range(n) if p != r}
    urls = {str(p): base64.b64encode(t.bind()).decode() for p, t in transports.items()}
    every = [json.loads(x) for x in _exchange(comm, json.dumps(urls).encode())]
    for p in sorted(transports):  # ascending on every rank: each pair meets
        assert transports[p].connect(base64.b64decode(every[p][str(r)])) == 0
        assert transports[p].connected()
    return transports


def _share(comm, buffer: RdmaRemoteBuffer) -> list[RdmaRemoteBuffer]:
    """Every rank's remote buffer (pickled, as users send them)."""
    return [pickle.loads(x) for x in _exchange(comm, pickle.dumps(buffer))]


def _pattern(rank: int, nbytes: int) -> torch.Tensor:
    return ((torch.arange(nbytes, dtype=torch.int64) * 7 + 31 * rank) % 251 + 1).to(torch.uint8)


def _wait_signals(transport: RdmaTransport, count: int, peer: int) -> None:
    """Poll ``transport.signals()`` until it reaches ``count`` (30 s at most)."""
    deadline = time.monotonic() + 30
    while transport.signals() < count:
        assert time.monotonic() < deadline, f"no signal {count} from rank {peer}"


def _new_comm():
    os.environ.pop("TORCHCOMM_WINDOW_TRANSPORT", None)
    return torchcomms.new_comm("gloo", CPU, name=unique_name("nixl"))


# -- bodies ----------------------------------------------------------------------------------


def body_every_pair_writes_and_reads(chunk: int) -> dict:
    comm = _new_comm()
    r, n = comm.get_rank(), comm.get_size()
    transports = _mesh(comm)
    inbox = torch.zeros(n * chunk, dtype=torch.uint8)
    outbox = _pattern(r, chunk)
    readback = torch.zeros(n * chunk, dtype=torch.uint8)
    m_in, m_out, m_back = RdmaMemory(inbox), RdmaMemory(outbox), RdmaMemory(readback)
    inboxes = _share(comm, m_in.to_remote_buffer())
    outboxes = _share(comm, m_out.to_remote_buffer())
    for p, t in transports.items():
        slot = RdmaRemoteBuffer(inboxes[p].ptr + r * chunk, chunk, inboxes[p].access_key)
        assert t.write(m_out.to_view(), slot) == 0
    comm.barrier()  # every write has returned, so every byte is in place
    for p in transports:
        assert torch.equal(inbox[p * chunk : (p + 1) * chunk], _pattern(p, chunk)), p
        assert transports[p].read(m_back.to_mutable_view(p * chunk, chunk), outboxes[p]) == 0
        assert torch.equal(readback[p * chunk : (p + 1) * chunk], _pattern(p, chunk)), p
    assert not inbox[r * chunk : (r + 1) * chunk].any()  # nobody wrote into its own slot
    comm.barrier()
    for memory in (m_in, m_out, m_back):
        memory.close()
    for t in transports.values():
        t.close()
    comm.finalize()
    return {"peers": len(transports)}


def body_typed_tensors_at_offsets() -> None:
    """float64 data written at an element offset lands bit-exact; other bytes stay put."""
    comm = _new_comm()
    r, n = comm.get_rank(), comm.get_size()
    transports = _mesh(comm)
    target = torch.full((100,), -1.0, dtype=torch.float64)
    source = torch.randn(100, dtype=torch.float64, generator=torch.Generator().manual_seed(r))
    m_t, m_s = RdmaMemory(target), RdmaMemory(source)
    remotes = _share(comm, m_t.to_remote_buffer())
    right, left = (r + 1) % n, (r - 1) % n
    at, count = 10 * 8, 25 * 8  # bytes: elements 10..34 of the peer from elements 50..74
    remote = RdmaRemoteBuffer(remotes[right].ptr + at, count, remotes[right].access_key)
    transports[right].write(m_s.to_view(50 * 8, count), remote)
    comm.barrier()
    sent = torch.randn(100, dtype=torch.float64, generator=torch.Generator().manual_seed(left))
    expected = torch.full((100,), -1.0, dtype=torch.float64)
    expected[10:35] = sent[50:75]
    assert torch.equal(target, expected)
    comm.barrier()
    m_t.close()
    m_s.close()
    comm.finalize()


def body_bad_input_is_refused(with_third_party: bool) -> list[str]:
    """Each bad call raises; afterwards every rank's target buffer is untouched."""
    comm = _new_comm()
    r, n = comm.get_rank(), comm.get_size()
    transports = _mesh(comm)
    target = torch.full((64,), 7, dtype=torch.uint8)
    m_target = RdmaMemory(target)
    remotes = _share(comm, m_target.to_remote_buffer())
    spare = torch.full((64,), 9, dtype=torch.uint8)
    m_spare = RdmaMemory(spare)
    spares = _share(comm, m_spare.to_remote_buffer())
    source = torch.ones(64, dtype=torch.uint8)
    m_src = RdmaMemory(source)
    right = (r + 1) % n
    t = transports[right]
    messages: list[str] = []

    def refused(call, exc_type) -> None:
        try:
            call()
        except exc_type as exc:
            messages.append(str(exc))
        else:
            raise AssertionError(f"accepted: {call}")

    refused(lambda: m_src.to_view(60, 8), torchcomms.CommInputError)
    refused(lambda: m_src.to_mutable_view(-1), torchcomms.CommInputError)
    refused(lambda: m_src.to_view(0.5), torchcomms.CommTypeError)  # type: ignore[arg-type]
    refused(lambda: t.write(m_src.to_view(0, 32), remotes[right]), torchcomms.CommInputError)
    beyond = RdmaRemoteBuffer(remotes[right].ptr + 60, 8, remotes[right].access_key)
    refused(lambda: t.write(m_src.to_view(0, 8), beyond), torchcomms.CommInputError)
    before = RdmaRemoteBuffer(remotes[right].ptr - 8, 8, remotes[right].access_key)
    refused(lambda: t.read(m_src.to_mutable_view(0, 8), before), torchcomms.CommInputError)
    damaged = RdmaRemoteBuffer(remotes[right].ptr, 64, "not-a-key")
    refused(lambda: t.write(m_src.to_view(), damaged), torchcomms.CommInputError)
    if with_third_party:  # the key of rank r+2 on the transport connected to rank r+1
        refused(lambda: t.write(m_src.to_view(), remotes[(r + 2) % n]), torchcomms.CommInputError)
    refused(lambda: t.write("bytes", remotes[right]), torchcomms.CommTypeError)  # type: ignore[arg-type]
    refused(lambda: t.read(m_src.to_view(), remotes[right]), torchcomms.CommTypeError)  # type: ignore[arg-type]
    refused(lambda: RdmaMemory(torch.zeros(4, 4).t()), torchcomms.CommInputError)
    refused(lambda: RdmaMemory(torch.zeros(0)), torchcomms.CommInputError)
    refused(lambda: RdmaMemory([1, 2]), torchcomms.CommTypeError)  # type: ignore[arg-type]
    lone = RdmaTransport(CPU)
    refused(lambda: lone.write(m_src.to_view(), remotes[right]), torchcomms.CommStateError)
    refused(lambda: lone.connect(b"garbage"), torchcomms.CommInputError)
    lone.close()
    moved = torch.ones(64, dtype=torch.uint8)
    m_moved = RdmaMemory(moved)
    moved.set_(torch.ones(64, dtype=torch.uint8))  # the tensor now lives elsewhere
    refused(lambda: t.write(m_moved.to_view(), remotes[right]), torchcomms.CommStateError)
    freed = torch.ones(64, dtype=torch.uint8)
    m_freed = RdmaMemory(freed)
    freed.untyped_storage().resize_(0)  # its memory is gone (what FSDP does to parameters)
    refused(lambda: t.write(m_freed.to_view(), remotes[right]), torchcomms.CommStateError)
    # The peer releases its spare buffer; its old remote buffer is refused here afterwards.
    comm.barrier()
    m_spare.close()
    comm.barrier()
    refused(lambda: t.write(m_src.to_view(), spares[right]), torchcomms.CommStateError)
    refused(lambda: t.read(m_src.to_mutable_view(), spares[right]), torchcomms.CommStateError)
    comm.barrier()
    assert torch.equal(target, torch.full((64,), 7, dtype=torch.uint8)), target
    assert torch.equal(spare, torch.full((64,), 9, dtype=torch.uint8)), spare
    comm.barrier()  # every rank has checked before anyone writes again
    # A good write still works after all that.
    t.write(m_src.to_view(), remotes[right])
    comm.barrier()
    assert torch.equal(target, torch.ones(64, dtype=torch.uint8))
    comm.barrier()
    m_target.close()
    m_src.close()
    comm.finalize()
    return messages


def body_peer_dies_mid_transfers() -> dict:
    """Rank 1 exits while rank 0 writes 1 MiB again and again: rank 0 gets an error."""
    comm = _new_comm()
    r = comm.get_rank()
    transports = _mesh(comm, timeout=timedelta(seconds=20))
    buf = torch.zeros(1 << 20, dtype=torch.uint8)
    memory = RdmaMemory(buf)
    remotes = _share(comm, memory.to_remote_buffer())
    comm.barrier()
    if r == 1:
        time.sleep(0.5)
        os._exit(0)
    start, writes = time.monotonic(), 0
    try:
        while time.monotonic() - start < 30:
            transports[1].write(memory.to_view(), remotes[1])
            writes += 1
    except (torchcomms.CommOperationError, torchcomms.CommTimeoutError) as exc:
        failed_after = time.monotonic() - start
        closing = time.monotonic()
        memory.close()  # exposed to the dead peer: must not wait for its answer
        return {
            "error": f"{type(exc).__name__}: {exc}",
            "failed_after": failed_after,
            "writes": writes,
            "close_s": time.monotonic() - closing,
        }
    raise AssertionError("writes to a dead peer kept succeeding for 30 s")


def body_signals_order_writes(rounds: int) -> dict:
    """Every rank writes a round's pattern into its slot at every peer, then signals it; a
    rank that has seen a peer's ``rounds``-th signal must find that round's bytes in place."""
    comm = _new_comm()
    r, n = comm.get_rank(), comm.get_size()
    transports = _mesh(comm)
    assert all(t.supports_signals() for t in transports.values())
    chunk = 4096 + 5
    inbox = torch.zeros(n * chunk, dtype=torch.uint8)
    outbox = torch.zeros(chunk, dtype=torch.uint8)
    m_in, m_out = RdmaMemory(inbox), RdmaMemory(outbox)
    remotes = _share(comm, m_in.to_remote_buffer())
    mismatches = 0
    for round_ in range(1, rounds + 1):
        outbox.copy_(_pattern(r + 100 * round_, chunk))
        for p, t in transports.items():
            slot = RdmaRemoteBuffer(remotes[p].ptr + r * chunk, chunk, remotes[p].access_key)
            t.write(m_out.to_view(), slot)
            assert t.signal() == 0
        for p, t in transports.items():
            _wait_signals(t, round_, p)
            # The peer writes its next round only after seeing ours: the bytes are round_'s.
            got = inbox[p * chunk : (p + 1) * chunk]
            mismatches += int(not torch.equal(got, _pattern(p + 100 * round_, chunk)))
        comm.barrier()
    counts = {p: t.signals() for p, t in transports.items()}
    m_in.close()
    m_out.close()
    for t in transports.values():
        t.close()
    comm.finalize()
    return {"mismatches": mismatches, "counts": counts}


def body_posted_writes(rounds: int) -> dict:
    """Posted writes and signals between every pair: a rank that saw a peer's n-th signal
    finds round n's bytes; a posted write then a write of the same bytes land in that order
    once flushed; and the refusals of post_write."""
    comm = _new_comm()
    r, n = comm.get_rank(), comm.get_size()
    transports = _mesh(comm)
    chunk = 1000 + 3
    inbox = torch.zeros(n * chunk, dtype=torch.uint8)
    m_in = RdmaMemory(inbox)
    remotes = _share(comm, m_in.to_remote_buffer())
    slots = {
        p: RdmaRemoteBuffer(remotes[p].ptr + r * chunk, chunk, remotes[p].access_key)
        for p in transports
    }
    mismatches = 0
    for round_ in range(1, rounds + 1):
        data = _pattern(r + 100 * round_, chunk)
        for p, t in transports.items():
            assert t.post_write(data, slots[p]) == 0
            t.signal()
        data.zero_()  # the bytes were taken when post_write returned
        for p, t in transports.items():
            _wait_signals(t, round_, p)
            got = inbox[p * chunk : (p + 1) * chunk]
            mismatches += int(not torch.equal(got, _pattern(p + 100 * round_, chunk)))
        comm.barrier()
    # A posted write, then a (one-sided) write of the same bytes: flush orders them.
    last = _pattern(r + 7, chunk)
    m_last = RdmaMemory(last)
    for p, t in transports.items():
        t.post_write(torch.full((chunk,), 9, dtype=torch.uint8), slots[p])
        t.flush()
        t.write(m_last.to_view(), slots[p])
        t.signal()
    for p, t in transports.items():
        _wait_signals(t, rounds + 1, p)
        got = inbox[p * chunk : (p + 1) * chunk]
        mismatches += int(not torch.equal(got, _pattern(p + 7, chunk)))
    comm.barrier()
    refusals = []
    t0 = transports[min(transports)]
    slot0 = slots[min(transports)]
    for bad in (
        lambda: t0.post_write(torch.zeros(chunk + 1, dtype=torch.uint8), slot0),
        lambda: t0.post_write(torch.zeros(t0.max_post_bytes() + 1, dtype=torch.uint8), slot0),
        lambda: t0.post_write(b"bytes", slot0),
        lambda: t0.post_write(torch.zeros(chunk, dtype=torch.uint8), "key"),
    ):
        try:
            bad()
        except (torchcomms.CommInputError, torchcomms.CommTypeError) as exc:
            refusals.append(str(exc))
    comm.barrier()
    m_in.close()  # released: a later posted write to it is refused by the sender
    comm.barrier()
    try:
        t0.post_write(torch.zeros(chunk, dtype=torch.uint8), slot0)
    except torchcomms.CommStateError as exc:
        refusals.append(str(exc))
    m_last.close()
    for t in transports.values():
        t.close()
    comm.finalize()
    return {"mismatches": mismatches, "refusals": refusals}


def body_passive_target_over_tcp() -> dict:
    """Rank 1 sleeps, never calling the transport, while rank 0 writes 1 MiB into it ten
    times over UCX's TCP (where the target takes part): its service thread must progress."""
    comm = _new_comm()
    r = comm.get_rank()
    transports = _mesh(comm)
    buf = _pattern(0, 1 << 20) if r == 0 else torch.zeros(1 << 20, dtype=torch.uint8)
    memory = RdmaMemory(buf)
    remotes = _share(comm, memory.to_remote_buffer())
    comm.barrier()
    result: dict = {}
    if r == 1:
        time.sleep(4.0)  # quiet for over a second first, then the writes arrive
    else:
        time.sleep(1.5)
        start = time.monotonic()
        for _ in range(10):
            transports[1].write(memory.to_view(), remotes[1])
        result["write_s"] = time.monotonic() - start
    comm.barrier()
    if r == 1:
        result["intact"] = bool(torch.equal(buf, _pattern(0, 1 << 20)))
    memory.close()
    for t in transports.values():
        t.close()
    comm.finalize()
    return result


def body_connect_waits_for_the_peer_then_times_out() -> dict:
    comm = _new_comm()
    r = comm.get_rank()
    t = RdmaTransport(CPU, timeout=timedelta(seconds=1.5))
    urls = _exchange(comm, t.bind())
    result: dict = {}
    if r == 0:  # rank 1 never connects back
        start = time.monotonic()
        try:
            t.connect(urls[1])
        except torchcomms.CommTimeoutError as exc:
            result = {"error": str(exc), "after": time.monotonic() - start}
        else:
            raise AssertionError("connect returned although the peer never connected")
    comm.barrier()
    t.close()
    comm.finalize()
    return result


# -- tests (2 and 4 ranks) -------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 4096, (1 << 20) + 3], ids=["1B", "4KiB", "1MiB+3"])
def test_every_pair_writes_and_reads_exact_bytes(pool: RankPool, chunk: int) -> None:
    results = pool.run(body_every_pair_writes_and_reads, chunk, timeout=120)
    assert all(res["peers"] == pool.world_size - 1 for res in results)


def test_typed_data_at_offsets_lands_bit_exact(pool: RankPool) -> None:
    pool.run(body_typed_tensors_at_offsets, timeout=120)


def test_bad_input_is_refused_before_any_byte_moves(pool: RankPool) -> None:
    third = pool.world_size >= 3
    for messages in pool.run(body_bad_input_is_refused, third, timeout=120):
        text = "\n".join(messages)
        assert len(messages) == (19 if third else 18), text
        assert "does not fit in the registered 64 byte(s)" in messages[0]
        assert "must be equal" in text and "not inside the memory its key exposes" in text
        assert "not a torchcomms-nixl key" in text and "contiguous" in text
        assert "not connected" in text and "freed or moved" in text
        assert "released the memory" in text
        if third:
            assert "belongs to agent" in text


def test_a_dying_peer_fails_the_transfer_within_the_timeout(pool2: RankPool) -> None:
    outcomes = pool2.run_outcomes(body_peer_dies_mid_transfers, timeout=90)
    assert outcomes[1].status == "died"
    result = outcomes[0].value
    assert outcomes[0].ok, outcomes[0].error
    assert "disconnected" in result["error"] or "timed out" in result["error"], result
    assert result["writes"] > 0 and result["failed_after"] < 25, result
    assert result["close_s"] < 10, result


def test_connect_waits_for_the_peer_and_times_out_clearly(pool2: RankPool) -> None:
    result = pool2.run(body_connect_waits_for_the_peer_then_times_out, timeout=60)[0]
    assert "did not connect back" in result["error"] and "timed out" in result["error"]
    assert 1.4 < result["after"] < 10, result


def test_signals_arrive_after_the_writes_before_them_and_are_counted_exactly(
    pool: RankPool,
) -> None:
    for result in pool.run(body_signals_order_writes, 20, timeout=120):
        assert result["mismatches"] == 0, result
        assert set(result["counts"].values()) == {20}, result


def test_posted_writes_land_before_later_signals_and_in_order_with_writes(
    pool: RankPool,
) -> None:
    for result in pool.run(body_posted_writes, 20, timeout=120):
        assert result["mismatches"] == 0, result
        text = "\n".join(result["refusals"])
        assert len(result["refusals"]) == 5, text
        assert "must be equal" in text and "more than the" in text
        assert "must be a torch.Tensor" in text and "must be an RdmaRemoteBuffer" in text
        assert "released the memory" in text


def test_a_target_that_is_not_waiting_takes_part_over_tcp() -> None:
    with RankPool(2, env={"UCX_TLS": "tcp"}) as pool:
        rank0, rank1 = pool.run(body_passive_target_over_tcp, timeout=90)
    assert rank1["intact"], "the writes did not arrive"
    # While rank 1 slept for 2.5 s more: done long before that (about 0.03 s here).
    assert rank0["write_s"] < 2.0, rank0


def test_the_progress_variable_is_checked() -> None:
    from torchcomms_nixl import engine

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(engine.PROGRESS_VARIABLE, "fast")
        with pytest.raises(ValueError, match="not a whole number of microseconds"):
            engine.progress_us()
        mp.setenv(engine.PROGRESS_VARIABLE, "250")
        assert engine.progress_us() == 250
        mp.delenv(engine.PROGRESS_VARIABLE)
        assert engine.progress_us() == engine.PROGRESS_US


# -- in this process (loopback) --------------------------------------------------------------


def test_loopback_write_and_read_in_one_process() -> None:
    a, b = RdmaTransport(CPU), RdmaTransport(CPU)
    a.connect(b.bind())
    b.connect(a.bind())
    src = torch.arange(256, dtype=torch.int32)
    dst = torch.zeros(256, dtype=torch.int32)
    m_src, m_dst = RdmaMemory(src), RdmaMemory(dst)
    assert a.write(m_src.to_view(), m_dst.to_remote_buffer()) == 0
    assert torch.equal(dst, src)
    dst.zero_()
    whole = m_src.to_remote_buffer()
    first_half = RdmaRemoteBuffer(whole.ptr, 512, whole.access_key)
    assert b.read(m_dst.to_mutable_view(0, 512), first_half) == 0
    assert torch.equal(dst[:128], src[:128]) and not dst[128:].any()
    m_src.close()
    m_dst.close()
    a.close()
    b.close()


def test_loopback_signals_and_their_refusals() -> None:
    a, b = RdmaTransport(CPU), RdmaTransport(CPU)
    with pytest.raises(torchcomms.CommStateError, match="not connected"):
        a.signal()
    a.connect(b.bind())
    b.connect(a.bind())
    assert a.supports_signals() and b.signals() == 0
    assert a.signal() == 0 and a.signal() == 0
    assert b.signals() == 2 and a.signals() == 0
    a.close()
    with pytest.raises(torchcomms.CommStateError, match="closed"):
        a.signal()
    b.close()


def test_registrations_are_reused_and_released() -> None:
    from torchcomms_nixl.agent import agent

    owner = agent()
    base = owner.registered_regions()
    t = torch.zeros(1024)
    first = RdmaMemory(t)
    again = RdmaMemory(t[256:512])
    assert not first.reused_registration() and again.reused_registration()
    assert owner.registered_regions() == base + 1
    first.close()
    assert owner.registered_regions() == base + 1  # still used by the second
    again.close()
    assert owner.registered_regions() == base
    try:
        again.to_view()
    except torchcomms.CommStateError as exc:
        assert "closed" in str(exc)
    else:
        raise AssertionError("a closed RdmaMemory made a view")


def test_collected_memory_is_deregistered_in_the_background() -> None:
    from torchcomms_nixl.agent import agent

    owner = agent()
    base = owner.registered_regions()
    memory = RdmaMemory(torch.zeros(4096))
    memory.to_remote_buffer()  # exposed: released through the revocation protocol
    del memory
    deadline = time.monotonic() + 10
    while owner.registered_regions() != base and time.monotonic() < deadline:
        time.sleep(0.01)
    assert owner.registered_regions() == base


def test_remote_buffer_pickles_and_compares() -> None:
    buf = RdmaRemoteBuffer(0x1000, 64, "nixl1:abc")
    back = pickle.loads(pickle.dumps(buf))
    assert back == buf and (back.ptr, back.len, back.access_key) == (0x1000, 64, "nixl1:abc")
    assert buf.__reduce__() == (RdmaRemoteBuffer, (0x1000, 64, "nixl1:abc"))


def test_supported_and_listed() -> None:
    from torchcomms_core.cli import main

    assert RdmaTransport.supported()
    assert "nixl" in torchcomms.available_transports()
    assert main(["transports"]) == 0

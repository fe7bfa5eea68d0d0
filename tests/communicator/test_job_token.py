"""The job token (docs/security.md): store entries only this job's ranks can write.

Real ranks over gloo: with a token every value in the store is signed and stored under a
name only members can compute; an entry that does not verify fails the rank that reads it
with a ``CommStateError`` naming the key (test_strangers.py: with real processes, forged
under the real names); the token shows nowhere.
"""

from __future__ import annotations

import io
import logging
from datetime import timedelta

import pytest
import torch
from torch._C._distributed_c10d import HashStore, PrefixStore

import torchcomms
from torchcomms_core.creation import signing
from torchcomms_core.creation.signing import SigningStore, derive_key
from torchcomms_core.foundation.errors import CommInputError, CommStateError
from torchcomms_core.testing import unique_name

TOKEN = "job-token-0123456789abcdef-secret"
OTHER = "another-job-token-fedcba9876543210"


def _store(token: str = TOKEN, attempt: int = 0) -> tuple[SigningStore, HashStore]:
    inner = HashStore()
    return SigningStore(inner, derive_key(token.encode(), "", attempt)), inner


# -- the signing store, in one process ------------------------------------------------------


def test_values_round_trip_and_are_stored_signed_under_hidden_names() -> None:
    store, inner = _store()
    top = PrefixStore("comm/x", store)
    top.set("k", b"value")
    assert top.get("k") == b"value"
    assert not inner.check(["comm/x/k"])  # the plain name holds nothing
    raw = inner.get(store.physical("comm/x/k"))
    assert raw.endswith(b"value") and raw != b"value"
    assert top.add("n", 2) == 2 and top.add("n", 1) == 3
    top.append("a", b"x")
    top.append("a", b"yz")
    assert top.get("a") == b"xyz"
    assert top.compare_set("c", "", "one") == b"one"
    assert top.compare_set("c", "one", "two") == b"two"
    assert top.compare_set("c", "wrong", "three") == b"two"
    assert top.multi_get(["k", "c"]) == [b"value", b"two"]
    top.multi_set(["m1", "m2"], [b"1", b"2"])
    assert top.get("m2") == b"2"
    assert top.check(["k", "n"]) and not top.check(["absent"])
    top.wait(["k"], timedelta(seconds=1))
    assert store.delete_key("comm/x/k") and not top.check(["k"])


@pytest.mark.parametrize("kind", ["unsigned", "corrupted", "other job", "earlier attempt", "moved"])
def test_an_entry_not_written_by_this_job_is_refused_naming_the_key(kind: str) -> None:
    store, inner = _store(attempt=1)
    store.set("comm/x/peer", b"10.0.0.1:1234")
    name = store.physical("comm/x/peer")
    good = inner.get(name)
    if kind == "unsigned":
        forged = b"10.6.6.6:666"
    elif kind == "corrupted":
        forged = good[:-1] + bytes([good[-1] ^ 1])
    elif kind == "other job":
        other, _ = _store(OTHER, attempt=1)
        forged = signing.signed(derive_key(OTHER.encode(), "", 1), "comm/x/peer", b"10.6.6.6:1")
        del other
    elif kind == "earlier attempt":
        forged = signing.signed(derive_key(TOKEN.encode(), "", 0), "comm/x/peer", b"10.6.6.6:1")
    else:  # a genuine value of another key, copied here
        store.set("comm/x/other", b"10.6.6.6:1")
        forged = inner.get(store.physical("comm/x/other"))
    inner.set(name, forged)
    with pytest.raises(CommStateError, match=r"'comm/x/peer' was not written by a member"):
        store.get("comm/x/peer")
    assert store.failure is not None
    with pytest.raises(CommStateError):
        store.multi_get(["comm/x/peer"])


def test_a_refusal_raises_the_alarm_that_fails_every_other_member_waiting() -> None:
    """A member that never reads the forged entry, blocked on a key nobody will write, fails
    with the refusal as soon as it looks at the alarm (every 0.2 s), not at its timeout."""
    import time

    inner = HashStore()
    key = derive_key(TOKEN.encode(), "", 0)
    reader, waiter = SigningStore(inner, key), SigningStore(inner, key)
    inner.set(reader.physical("comm/x/peer"), b"10.6.6.6:666")  # forged
    with pytest.raises(CommStateError):
        reader.get("comm/x/peer")
    start = time.monotonic()
    with pytest.raises(CommStateError, match=r"'comm/x/peer' was not written.*read it and refused"):
        waiter.wait(["comm/x/never"], timedelta(seconds=30))
    with pytest.raises(CommStateError, match="'comm/x/peer'"):
        SigningStore(inner, key).get("comm/x/never")
    assert time.monotonic() - start < 5
    # A stranger's alarm (unsigned) is itself refused: no member trusts it either.
    other = HashStore()
    other.set(SigningStore(other, key).physical(signing.ALARM_KEY), b"comm/x/forged-alarm")
    with pytest.raises(CommStateError, match=signing.ALARM_KEY):
        SigningStore(other, key).wait(["comm/x/never"], timedelta(seconds=30))
    # Without an alarm the store's own timeout error comes at the timeout.
    quiet = SigningStore(HashStore(), key)
    start = time.monotonic()
    with pytest.raises(torch.distributed.DistStoreError):
        quiet.wait(["comm/x/never"], timedelta(seconds=0.5))
    assert 0.4 < time.monotonic() - start < 5


def test_appended_chunks_verify_one_by_one() -> None:
    store, inner = _store()
    store.append("d", b"a,")
    inner.append(store.physical("d"), b"b,")  # a stranger's chunk after a member's
    with pytest.raises(CommStateError, match="appended chunk at byte"):
        store.get("d")


def test_the_token_shows_nowhere(caplog: pytest.LogCaptureFixture) -> None:
    store, _ = _store()
    assert TOKEN not in repr(store) and TOKEN not in str(store)
    with pytest.raises(TypeError):
        import pickle

        pickle.dumps(store)
    with pytest.raises(CommInputError) as short:
        signing.job_token({"job_token": "short-secret"})
    assert "short-secret" not in str(short.value)


def test_no_token_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHCOMM_JOB_TOKEN", raising=False)
    plain = HashStore()
    assert signing.signing_store(plain, {}) is plain
    monkeypatch.setenv("TORCHCOMM_JOB_TOKEN", TOKEN)
    wrapped = signing.signing_store(plain, {})
    assert isinstance(wrapped, SigningStore)
    assert signing.signing_store(PrefixStore("p", wrapped), {}).underlying_store is wrapped


# -- real ranks --------------------------------------------------------------------------


def body_signed_job(token: str, lazy: bool) -> dict:
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logging.getLogger().addHandler(handler)
    hints = {"job_token": token, "lazy": "true" if lazy else "false"}
    try:
        from torchcomms.hooks import FlightRecorderHook

        comm = torchcomms.new_comm("gloo", "cpu", name=unique_name("signed"), hints=hints)
        recorder = FlightRecorderHook(16, isolated=True).register_with_comm(comm)
        rank, size = comm.get_rank(), comm.get_size()
        t = torch.full((1000,), float(rank + 1))
        comm.all_reduce(t, torchcomms.ReduceOp.SUM)
        child = comm.split(list(range(size)), unique_name("signedsplit"))
        assert child is not None
        c = torch.full((4,), float(rank))
        child.all_reduce(c, torchcomms.ReduceOp.MAX)
        seen = " ".join(
            [
                repr(comm),
                str(comm.get_options()),
                repr(comm.get_options().hints),
                repr(comm.get_backend_impl().options),
                recorder.dump_json(),
                log.getvalue(),
            ]
        )
        signed = signing.is_signed(comm.get_options().store)
        child.finalize()
        comm.finalize()
    finally:
        logging.getLogger().removeHandler(handler)
    return {
        "sum": t.tolist(),
        "max": c.tolist(),
        "signed": signed,
        "leak": token in seen,
        "size": size,
    }


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_a_signed_job_computes_exact_results(pool4, lazy: bool) -> None:
    results = pool4.run(body_signed_job, TOKEN, lazy, timeout=120)
    size = results[0]["size"]
    expected = float(size * (size + 1) // 2)
    for r in results:
        assert r["signed"] and not r["leak"]
        assert r["sum"] == [expected] * 1000
        assert r["max"] == [float(size - 1)] * 4


def body_reconfigure_with_a_token(token: str) -> dict:
    """Self-hosted rendezvous: members connect to the first handle's store, signed with
    the same token as the rendezvous its owner hosts."""
    from torch.distributed import TCPStore

    from torchcomms_core.testing import current_rank

    name = unique_name("signedft")
    comm = torchcomms.new_comm(
        "gloo",
        "cpu",
        name=name,
        enable_reconfigure=True,
        timeout=timedelta(seconds=30),
        hints={"job_token": token},
    )
    rank = current_rank()
    size = int(__import__("os").environ["TORCHCOMM_SIZE"])
    store = TCPStore(
        __import__("os").environ["MASTER_ADDR"],
        int(__import__("os").environ["MASTER_PORT"]),
        is_master=False,
    )
    store.set(f"{name}/{rank}", comm.get_init_handle())
    handles = [store.get(f"{name}/{r}").decode() for r in range(size)]
    comm.reconfigure(1, handles, timedelta(seconds=30))
    t = torch.full((8,), float(rank + 1))
    comm.all_reduce(t, torchcomms.ReduceOp.SUM)
    out = {
        "sum": t.tolist(),
        "size": comm.get_size(),
        "signed": [
            signing.is_signed(comm.get_options().store),
            signing.is_signed(comm.get_backend_impl().options.store),
        ],
    }
    comm.finalize()
    return out


def test_reconfigure_with_a_token_meets_in_signed_rendezvous(pool4) -> None:
    results = pool4.run(body_reconfigure_with_a_token, TOKEN, timeout=120)
    for r in results:
        assert r["signed"] == [True, True] and r["size"] == 4, results
        assert r["sum"] == [10.0] * 8


def test_a_mismatched_token_times_out_saying_to_check_the_token() -> None:
    """Ranks with different tokens never see each other's entries: the creation timeout
    says to check the token (two ranks as threads of one process, one store)."""
    import threading

    from torchcomms_core.testing import simulated_rank

    root = HashStore()
    errors: list[BaseException | None] = [None, None]

    def rank(r: int) -> None:
        with simulated_rank(r, 2):
            try:
                torchcomms.new_comm(
                    "gloo",
                    "cpu",
                    name="mismatch",
                    store=root,
                    timeout=timedelta(seconds=3),
                    abort_process_on_timeout_or_error=False,
                    hints={"job_token": TOKEN if r == 0 else OTHER},
                )
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                errors[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for exc in errors:
        assert exc is not None
        assert "TORCHCOMM_JOB_TOKEN" in str(exc), exc
        assert TOKEN not in str(exc) and OTHER not in str(exc)


_BRIDGE = """
import sys, torch, torch.distributed as dist
from torchcomms_core.creation import signing
signed = []
plain_set = signing.SigningStore.set
def counting_set(self, key, value):
    signed.append(key)
    plain_set(self, key, value)
signing.SigningStore.set = counting_set
dist.init_process_group("gloo")
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
sub = dist.new_group([0, 1])
u = torch.ones(2)
dist.all_reduce(u, group=sub)
# One write per line: the ranks share torchrun's stdout, and print() writes its pieces apart.
fields = [dist.get_rank(), t.tolist(), u.tolist(), bool(signed)]
line = " ".join(["RESULT", *map(str, fields)])
sys.stdout.write(line + "\\n")
sys.stdout.flush()
dist.destroy_process_group()
"""


def test_the_c10d_bridge_signs_with_the_token_from_the_environment(tmp_path) -> None:
    """Under TORCH_DISTRIBUTED_USE_TORCHCOMMS, torchrun's ranks pass the token as an
    ordinary environment variable; the groups c10d creates sign their entries."""
    import subprocess
    import sys

    from torchcomms_core.bench.launch import free_port

    script = tmp_path / "bridge.py"
    script.write_text(_BRIDGE)
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("TORCHCOMM_")}
    env.update(TORCH_DISTRIBUTED_USE_TORCHCOMMS="1", TORCHCOMM_JOB_TOKEN=TOKEN)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    lines = sorted(line for line in res.stdout.splitlines() if line.startswith("RESULT"))
    assert lines == [
        "RESULT 0 [3.0, 3.0, 3.0, 3.0] [2.0, 2.0] True",
        "RESULT 1 [3.0, 3.0, 3.0, 3.0] [2.0, 2.0] True",
    ], res.stdout
    assert TOKEN not in res.stdout + res.stderr

"""Strangers at the door of a 4-rank job with a job token, real processes on loopback.

A forger writes entries under the names the job's keys would have, a silent process holds
connections to the store's port open, a flooder opens and drops connections: the job
starts and computes the exact sum. A stranger who learnt the keys' real names (by watching
the store's traffic) makes the ranks that read its entries fail with a ``CommStateError``
naming the key, and the alarm they set fails every other rank with the same error: no rank
computes with its data and every rank ends within the timeout.
"""

from __future__ import annotations

from torchcomms_core.testing.strangers import run_job

TOKEN = "strangers-job-token-0123456789abcdef"


def test_a_job_with_a_token_starts_despite_strangers() -> None:
    result = run_job(4, token=TOKEN, strangers=("forger", "silent", "flooder"), timeout_s=30)
    assert all(r is not None for r in result.ranks), result.stderr  # no rank hung
    assert result.started, result.ranks


def test_entries_forged_under_the_real_names_fail_the_ranks_that_read_them() -> None:
    result = run_job(4, token=TOKEN, strangers=("eavesdropper",), timeout_s=10, limit_s=90)
    assert all(r is not None for r in result.ranks), result.stderr  # every rank ended
    assert not any(r.get("exact") for r in result.ranks if r is not None)
    assert result.refused, result.ranks
    first = min(r["fail_s"] for r in result.ranks if r is not None and "fail_s" in r)
    assert first < 10, result.ranks
    for r in result.ranks:
        assert r is not None and TOKEN not in r.get("message", "")
        # Every rank, the ones that never read a forged entry included, fails with the
        # refusal (not a timeout) and within the communicator's timeout of 10 s.
        assert r.get("error") == "CommStateError", result.ranks
        assert "not written by a member of this job" in r["message"], result.ranks
        assert r["fail_s"] < 10, result.ranks

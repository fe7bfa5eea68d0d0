"""The priority of Gloo's event-loop threads (hint ``loop_nice``), on real gloo ranks."""

from __future__ import annotations

import os
import sys

import pytest
import torch

import torchcomms
from torchcomms import CommInputError, ReduceOp
from torchcomms_core.plugin import usable_cores
from torchcomms_core.testing import unique_name
from torchcomms_gloo import loop_priority

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="thread priorities are read from /proc (Linux)"
)


def _nice_of(tids: set[int]) -> list[int]:
    return sorted(os.getpriority(os.PRIO_PROCESS, tid) for tid in tids)


def _build(hints: dict[str, str]) -> tuple[object, set[int]]:
    """A gloo communicator and the event-loop threads its creation started."""
    before = loop_priority.loop_threads()
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("loop"), hints=hints)
    return comm, loop_priority.loop_threads() - before


def body_hinted_priorities() -> tuple[int, list[int], list[int], list[int], float]:
    base = os.getpriority(os.PRIO_PROCESS, 0)  # what new threads of this one inherit
    plain, plain_loops = _build({"loop_nice": "0"})
    low, low_loops = _build({"loop_nice": "19"})
    mid, mid_loops = _build({"loop_nice": "7"})
    # The lowered loops still carry the traffic: every communicator reduces correctly.
    total = 0.0
    for comm in (plain, low, mid):
        t = torch.tensor([float(comm.get_rank() + 1)])
        comm.all_reduce(t, ReduceOp.SUM)
        total += t.item()
    # Building the later communicators left the first one's loop where it was.
    result = (base, _nice_of(plain_loops), _nice_of(low_loops), _nice_of(mid_loops), total)
    for comm in (mid, low, plain):
        comm.finalize()
    return result


def test_hint_sets_the_priority_of_this_communicators_event_loop_only(pool2) -> None:
    for base, plain, low, mid, total in pool2.run(body_hinted_priorities):
        assert low and all(n == 19 for n in low)
        assert mid and all(n == max(7, base) for n in mid)  # raising one needs privilege
        assert plain and all(n == base for n in plain)
        assert total == 3 * (1 + 2)


def body_auto(local_world_size: str | None, variable: str | None) -> list[int]:
    """The nice values of a default communicator's loops (``-1``: left as this thread's)."""
    saved = {k: os.environ.get(k) for k in ("LOCAL_WORLD_SIZE", loop_priority.LOOP_NICE_VARIABLE)}
    try:
        for key, value in (
            ("LOCAL_WORLD_SIZE", local_world_size),
            (loop_priority.LOOP_NICE_VARIABLE, variable),
        ):
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        comm, loops = _build({})
        t = torch.ones(3)
        comm.all_reduce(t, ReduceOp.SUM)
        assert t.tolist() == [float(comm.get_size())] * 3
        base = os.getpriority(os.PRIO_PROCESS, 0)
        nices = [-1 if n == base else n for n in _nice_of(loops)]
        comm.finalize()
        return nices
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_auto_lowers_the_loop_only_where_ranks_outnumber_cores(pool2) -> None:
    cores = usable_cores()
    crowded = str(4 * cores)  # each rank's thread and its loop cannot have a core each
    for loops in pool2.run(body_auto, crowded, None):
        assert loops and all(n == 19 for n in loops)
    roomy_expected = 19 if 2 > cores else -1  # one rank on this machine
    for loops in pool2.run(body_auto, "1", None):
        assert loops and all(n == roomy_expected for n in loops)
    for loops in pool2.run(body_auto, None, None):  # no launcher count: left alone
        assert loops and all(n == -1 for n in loops)
    # The variable decides over the count, either way.
    for loops in pool2.run(body_auto, crowded, "0"):
        assert loops and all(n == -1 for n in loops)
    for loops in pool2.run(body_auto, None, "12"):
        assert loops and all(n == 12 for n in loops)


@pytest.mark.parametrize("value", ["20", "-1", "low", "1.5"])
def test_a_bad_value_is_refused_with_the_range(value, monkeypatch) -> None:
    with pytest.raises(CommInputError, match=r"loop_nice.*auto or a nice value from 0"):
        loop_priority.loop_nice({"loop_nice": value})
    monkeypatch.setenv(loop_priority.LOOP_NICE_VARIABLE, value)
    with pytest.raises(CommInputError, match=loop_priority.LOOP_NICE_VARIABLE):
        loop_priority.loop_nice({})
    # A valid hint wins over a bad variable.
    assert loop_priority.loop_nice({"loop_nice": "3"}) == 3


def body_bad_hint() -> str:
    try:
        torchcomms.new_comm(
            "gloo", torch.device("cpu"), name=unique_name("bad"), hints={"loop_nice": "99"}
        )
    except CommInputError as exc:
        return str(exc)
    return "created"


def test_a_bad_hint_fails_creation_on_every_rank(pool2) -> None:
    for message in pool2.run(body_bad_hint):
        assert "loop_nice" in message and "'99'" in message


def test_launcher_counts_are_read_in_order(monkeypatch) -> None:
    from torchcomms_core.plugin import LOCAL_SIZE_VARIABLES

    for name in LOCAL_SIZE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert loop_priority.local_ranks() is None
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "6")
    assert loop_priority.local_ranks() == 6
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert loop_priority.local_ranks() == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "zero")  # not a count: the next one is read
    assert loop_priority.local_ranks() == 6

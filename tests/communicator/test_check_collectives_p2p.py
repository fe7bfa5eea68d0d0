"""``TORCHCOMM_CHECK_COLLECTIVES`` covers point to point: mismatched sends and receives raise
on both sides, matching ones go through; on real gloo ranks.
"""

from __future__ import annotations

import os

import pytest
import torch

import torchcomms
from torchcomms import ReduceOp
from torchcomms_core.testing import unique_name


def _comm(**kwargs):
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("hard"), **kwargs)


def _healthy(comm) -> bool:
    """Run an all_reduce and check it: the communicator still works."""
    t = torch.ones(3)
    comm.all_reduce(t, ReduceOp.SUM)
    return bool(torch.equal(t, torch.full((3,), float(comm.get_size()))))


# -- TORCHCOMM_CHECK_COLLECTIVES covers point to point ------------------------------


def body_p2p_mismatch_checked(kind: str) -> tuple[str, bool]:
    os.environ["TORCHCOMM_CHECK_COLLECTIVES"] = "1"
    try:
        comm = _comm()
    finally:
        del os.environ["TORCHCOMM_CHECK_COLLECTIVES"]
    r = comm.get_rank()
    try:
        if kind == "send_recv":
            if r == 0:
                comm.send(torch.ones(4), 1)
            elif r == 1:
                comm.recv(torch.zeros(8), 0)
        elif kind == "dtype":
            if r == 0:
                comm.send(torch.ones(4), 1)
            elif r == 1:
                comm.recv(torch.zeros(4, dtype=torch.float64), 0)
        else:  # a batch exchanging with both neighbours, one size wrong
            n = comm.get_size()
            batch = comm.batch_op_create()
            batch.send(torch.ones(4), (r + 1) % n)
            batch.recv(torch.zeros(4 if r != 0 else 5), (r - 1) % n)
            batch.issue(False)
        outcome = "no error"
    except torchcomms.CommInputError as exc:
        outcome = "refused" if "nothing was sent" in str(exc) and "rank" in str(exc) else str(exc)
    ok = _healthy(comm)
    comm.finalize()
    return outcome, ok


@pytest.mark.parametrize("kind", ["send_recv", "dtype", "batch"])
def test_check_collectives_turns_p2p_mismatches_into_errors_on_both_sides(pool2, kind) -> None:
    assert pool2.run(body_p2p_mismatch_checked, kind) == [("refused", True)] * 2


def body_p2p_check_passes_matching_calls() -> list[float]:
    os.environ["TORCHCOMM_CHECK_COLLECTIVES"] = "1"
    try:
        comm = _comm()
    finally:
        del os.environ["TORCHCOMM_CHECK_COLLECTIVES"]
    r, n = comm.get_rank(), comm.get_size()
    got = torch.zeros(3)
    batch = comm.batch_op_create()
    batch.send(torch.full((3,), float(r)), (r + 1) % n)
    batch.recv(got, (r - 1) % n)
    batch.issue(False)
    comm.finalize()
    return got.tolist()


def test_check_collectives_lets_matching_p2p_through(pool) -> None:
    n = pool.world_size
    assert pool.run(body_p2p_check_passes_matching_calls) == [
        [float((r - 1) % n)] * 3 for r in range(n)
    ]

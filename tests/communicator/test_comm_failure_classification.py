"""Only engine errors mark a communicator failed: one rank's mistake never poisons it.

A failing hook or a backend's argument error is raised to the caller and the communicator
stays healthy; each body runs on real gloo ranks and ends with a checked collective.
"""

from __future__ import annotations

import torch

import torchcomms
from torchcomms import ReduceOp
from torchcomms_core.foundation.work import is_engine_failure, is_timeout_error
from torchcomms_core.testing import unique_name


def _comm(**kwargs):
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("hard"), **kwargs)


def _healthy(comm) -> bool:
    """Run an all_reduce and check it: the communicator still works."""
    t = torch.ones(3)
    comm.all_reduce(t, ReduceOp.SUM)
    return bool(torch.equal(t, torch.full((3,), float(comm.get_size()))))


# -- only engine errors mark a communicator failed -----------------------------------


def test_classification_does_not_read_type_errors_as_timeouts() -> None:
    assert not is_timeout_error(TypeError("got an unexpected keyword argument 'timeout'"))
    assert not is_engine_failure(TypeError("got an unexpected keyword argument 'timeout'"))
    assert not is_engine_failure(ValueError("bad value"))
    assert not is_engine_failure(torchcomms.CommInputError("refused"))
    assert is_timeout_error(RuntimeError("[gloo] Timed out waiting 4000ms for recv"))
    assert is_timeout_error(TimeoutError("deadline passed"))
    assert is_engine_failure(RuntimeError("Connection closed by peer"))


def body_hook_error_leaves_comm_healthy() -> tuple[str, bool]:
    comm = _comm()

    def failing_hook(name, op_id, args) -> None:
        raise KeyError("hook bug")

    handle = comm.register_pre_hook(failing_hook)
    try:
        comm.all_reduce(torch.ones(2), ReduceOp.SUM)
        outcome = "no error"
    except KeyError:
        outcome = "hook error raised"
    handle.remove()
    ok = _healthy(comm)
    comm.finalize()
    return outcome, ok


def test_a_failing_hook_does_not_poison_the_communicator(pool2) -> None:
    assert pool2.run(body_hook_error_leaves_comm_healthy) == [("hook error raised", True)] * 2


def body_backend_type_error_leaves_comm_healthy() -> tuple[str, bool]:
    from torchcomms_gloo import GlooBackend

    class Picky(GlooBackend):
        def broadcast(self, tensor, root, async_op, *, timeout=None, hints=None):
            if hints and "reject" in hints:
                raise TypeError("broadcast() got an unexpected keyword 'timeout_ms'")
            return super().broadcast(tensor, root, async_op, timeout=timeout, hints=hints)

    torchcomms.register_backend("picky_gloo", Picky)
    comm = torchcomms.new_comm("picky_gloo", torch.device("cpu"), name=unique_name("picky"))
    try:
        comm.broadcast(torch.ones(2), 0, hints={"reject": "1"})
        outcome = "no error"
    except torchcomms.CommTimeoutError:
        outcome = "misread as timeout"
    except TypeError:
        outcome = "TypeError"
    ok = _healthy(comm)
    comm.finalize()
    torchcomms.unregister_backend("picky_gloo")
    return outcome, ok


def test_a_backend_argument_error_is_not_a_timeout_and_not_fatal(pool2) -> None:
    assert pool2.run(body_backend_type_error_leaves_comm_healthy) == [("TypeError", True)] * 2

"""A plugin's own Python error reaches the caller; an engine failure still aborts.

The communicators here are created with ``abort_process_on_timeout_or_error=True`` (the
reference's default): an error raised by a collective plugin's code outside the engine
(its validation, its portable implementation before it calls the backend, a ``then``
step) must come back as the plugin's exception, with its traceback, and leave the
process and the communicator working. The same plugin timing out in the engine still
aborts the process.
"""

from __future__ import annotations

import signal
import traceback
from datetime import timedelta

import torch

import torchcomms
from torchcomms import Collective, ReduceOp, hookimpl
from torchcomms_core.plugin import then
from torchcomms_core.testing import RankPool, unique_name


def _step_fails(backend, tensor, async_op, *, timeout=None, hints=None):
    work = backend.all_reduce(tensor, ReduceOp.SUM, async_op, timeout=timeout, hints=hints)

    def regroup() -> None:
        tensor.view(3, -1)  # 5 elements: a RuntimeError from the plugin's own code

    return then(work, regroup)


def _impl_fails(backend, tensor, async_op, *, timeout=None, hints=None):
    raise RuntimeError("the plugin's portable implementation has a bug")


def _sum(backend, tensor, async_op, *, timeout=None, hints=None):
    return backend.all_reduce(tensor, ReduceOp.SUM, async_op, timeout=timeout, hints=hints)


def _validate_fails(comm, args, kwargs):
    raise RuntimeError("the plugin's validation has a bug")


def _engine_times_out(backend, tensor, async_op, *, timeout=None, hints=None):
    if backend.get_rank() == 0:  # nobody sends: the engine times out
        return backend.recv(tensor, 1, async_op, timeout=timedelta(seconds=1), hints=hints)
    return None


class Faulty:
    """Collectives whose plugin code raises, and one whose engine call times out."""

    @hookimpl
    def torchcomms_register_collectives(self) -> list[Collective]:
        return [
            Collective(name="step_fails_sum", impl=_step_fails, args=("tensor",)),
            Collective(name="impl_fails_sum", impl=_impl_fails, args=("tensor",)),
            Collective(
                name="validate_fails_sum", impl=_sum, args=("tensor",), validate=_validate_fails
            ),
            Collective(name="engine_times_out", impl=_engine_times_out, args=("tensor",)),
        ]


def _register() -> None:
    if "engine_times_out" not in torchcomms.list_collectives():
        torchcomms.register_plugin(Faulty(), name="faulty", provider="tc-faulty 0.1")


def body_plugin_errors() -> dict:
    _register()
    comm = torchcomms.new_comm(
        "gloo", "cpu", name=unique_name("faulty"), abort_process_on_timeout_or_error=True
    )
    out: dict = {}
    calls = {
        "then step, sync": lambda: comm.step_fails_sum(torch.ones(5)),
        "then step, async": lambda: comm.step_fails_sum(torch.ones(5), async_op=True).wait(),
        "implementation": lambda: comm.impl_fails_sum(torch.ones(5)),
        "validation": lambda: comm.validate_fails_sum(torch.ones(5)),
    }
    for what, call in calls.items():
        try:
            call()
        except Exception as exc:
            out[what] = {
                "type": type(exc).__name__,
                "message": str(exc),
                "traceback": "".join(traceback.format_exception(exc)),
            }
        else:
            out[what] = None
    t = torch.ones(2)
    comm.all_reduce(t, ReduceOp.SUM)  # the communicator is still healthy
    out["sum after"] = t.tolist()
    out["state"] = comm.is_aborted()
    comm.finalize()
    return out


def body_engine_failure_in_a_plugin() -> None:
    _register()
    comm = torchcomms.new_comm(
        "gloo", "cpu", name=unique_name("faulty"), abort_process_on_timeout_or_error=True
    )
    comm.engine_times_out(torch.ones(1))
    if comm.get_rank() == 1:
        import time

        time.sleep(5)


def test_plugin_errors_reach_the_caller_and_engine_failures_still_abort() -> None:
    # Plugins register once per process: fresh ranks, not the shared pools.
    with RankPool(2, comm_timeout_s=30) as fresh:
        results = fresh.run(body_plugin_errors, timeout=120)
        for out in results:
            for what in ("then step, sync", "then step, async"):
                err = out[what]
                assert err is not None and err["type"] == "RuntimeError", (what, err)
                assert "invalid for input of size 5" in err["message"]
                assert (
                    "in regroup" in err["traceback"] and "tensor.view(3, -1)" in err["traceback"]
                ), err["traceback"]
            err = out["implementation"]
            assert err["type"] == "RuntimeError" and "portable implementation" in err["message"]
            assert "in _impl_fails" in err["traceback"]
            err = out["validation"]
            assert err["type"] == "RuntimeError" and "validation has a bug" in err["message"]
            assert out["sum after"] == [2.0, 2.0] and out["state"] is False
        outcomes = fresh.run_outcomes(body_engine_failure_in_a_plugin, timeout=60)
    assert outcomes[0].status == "died" and outcomes[0].exitcode == -signal.SIGABRT, outcomes

"""The conformance suite: every API contract against the backend named on the command line.

Run: ``pytest --pyargs torchcomms_core.testing --torchcomms-backend NAME``.

A contract that fails says which rule it checks (``contracts.RULES``). A contract that
hangs (a rank still busy when ``--torchcomms-timeout`` runs out) prints every rank's
stack and stops the run: every later contract would wait out its timeout too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from torchcomms_core.foundation.errors import TorchCommError
from torchcomms_core.plugin_host.backends import get_backend_class
from torchcomms_core.testing import contracts, large
from torchcomms_core.testing.pool import RankFailure, RankPool
from torchcomms_core.testing.reference import DTYPES

Contract = Callable[..., list[Any]]

#: Exceptions that mean a rank is stuck (not merely wrong): the run stops after them.
_STUCK = frozenset({"CommTimeoutError", "PeerStuck"})


def _declared_dtypes(backend: str) -> list[str]:
    try:
        declared = set(get_backend_class(backend).supported_dtypes)
    except TorchCommError:  # test_backend_resolves_and_can_run_here reports it
        return ["float32"]
    return [name for name, dtype in DTYPES.items() if dtype in declared]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "dtype_name" in metafunc.fixturenames:
        backend = metafunc.config.getoption("--torchcomms-backend")
        names = _declared_dtypes(backend) if backend else ["float32"]
        metafunc.parametrize("dtype_name", names)


@pytest.fixture
def contract(
    request: pytest.FixtureRequest, conformance_pool: RankPool, torchcomms_timeout: float
) -> Contract:
    """``contract(rule, body, *args)`` runs ``body`` on every rank within the timeout.

    A failure names the rule ``contracts.RULES[rule]``; a hang also stops the session.
    """

    def run(rule: str, body: Callable[..., Any], *args: Any) -> list[Any]:
        outcomes = conformance_pool.run_outcomes(body, *args, timeout=torchcomms_timeout)
        if all(o.ok for o in outcomes):
            return [o.value for o in outcomes]
        failure = RankFailure(body.__name__, outcomes)
        hung = [o.rank for o in outcomes if o.status == "hung"]
        timed_out = [o.rank for o in outcomes if o.exc_type in _STUCK]
        # A rank that raised (a wrong result, a refused call) leaves its peers waiting only
        # for the pool's grace period, and the next contract gets fresh ranks. A rank that
        # hung, or an operation that timed out, would cost every later contract its whole
        # timeout: the run stops there.
        stuck = (hung or timed_out) and all(
            o.ok or o.status == "hung" or o.exc_type in _STUCK for o in outcomes
        )
        if stuck:
            request.session.shouldfail = (
                f"conformance contract {request.node.name} hung (--torchcomms-timeout "
                f"{torchcomms_timeout:g} s); later contracts were not run"
            )
            why = "; ".join(
                part
                for part in (
                    hung and f"rank(s) {', '.join(map(str, hung))} did not return (stacks below)",
                    timed_out
                    and f"rank(s) {', '.join(map(str, timed_out))} reported an operation "
                    f"that did not finish (tracebacks below)",
                )
                if part
            )
            why += "; the run stops here"
        else:
            why = "a rank failed (tracebacks below)"
            if hung:
                why += f"; rank(s) {', '.join(map(str, hung))} were left waiting for it"
        pytest.fail(
            f"conformance rule broken: {contracts.RULES[rule]}\n{why}\n{failure}", pytrace=False
        )

    return run


@pytest.fixture
def numerical(torchcomms_backend: str) -> None:
    """Skip a numerical contract for a backend that does not really communicate (fake)."""
    if not get_backend_class(torchcomms_backend).communicates:
        pytest.skip(
            f"backend {torchcomms_backend!r} declares communicates=False: its results are "
            f"not a collective's, so only the API-shape contracts apply"
        )


def test_backend_resolves_and_can_run_here(
    request: pytest.FixtureRequest, torchcomms_backend: str, torchcomms_device: str
) -> None:
    try:
        cls = get_backend_class(torchcomms_backend)
    except TorchCommError as exc:
        # Every later contract would fail the same way: stop here.
        request.session.shouldfail = f"backend {torchcomms_backend!r} cannot be loaded"
        pytest.fail(f"backend {torchcomms_backend!r} cannot be loaded: {exc}", pytrace=False)
    ok, reason = cls.is_available()
    assert ok, f"backend {torchcomms_backend!r} cannot run here: {reason}"
    assert torch.device(torchcomms_device).type in cls.devices


@pytest.mark.usefixtures("numerical")
def test_async_send_returns_before_the_peer_receives(
    contract: Contract, torchcomms_backend: str, torchcomms_device: str, torchcomms_timeout: float
) -> None:
    # Half the contract's time: rank 1 then still has time to receive and report.
    contract(
        "send_before_recv",
        large.body_send_before_recv,
        torchcomms_backend,
        torchcomms_device,
        max(2.0, torchcomms_timeout / 3),
    )


@pytest.mark.parametrize("count", [0, 5])
def test_every_operation_has_the_api_shapes(
    contract: Contract,
    conformance_pool: RankPool,
    torchcomms_backend: str,
    torchcomms_device: str,
    count: int,
) -> None:
    calls = contract(
        "api_shapes", contracts.body_api_shapes, torchcomms_backend, torchcomms_device, count
    )
    assert calls == [2 * 14 + 1] * conformance_pool.world_size


@pytest.mark.usefixtures("numerical")
def test_every_operation_on_every_declared_dtype(
    contract: Contract, torchcomms_backend: str, torchcomms_device: str, dtype_name: str
) -> None:
    contract(
        "every_op", contracts.body_every_op, torchcomms_backend, torchcomms_device, dtype_name, 7
    )


@pytest.mark.usefixtures("numerical")
@pytest.mark.parametrize("count", [0, 1, 1000])
def test_every_operation_at_edge_counts(
    contract: Contract, torchcomms_backend: str, torchcomms_device: str, count: int
) -> None:
    contract(
        "edge_counts",
        contracts.body_every_op,
        torchcomms_backend,
        torchcomms_device,
        "float32",
        count,
    )


@pytest.mark.usefixtures("numerical")
def test_point_to_point_above_socket_buffers(
    contract: Contract, torchcomms_backend: str, torchcomms_device: str
) -> None:
    received = contract("large_p2p", large.body_large_p2p, torchcomms_backend, torchcomms_device)
    # Two messages of LARGE_MESSAGE_BYTES plus a few elements, less one element per rank of
    # distance (uneven sizes): at 8 ranks some are a few bytes short of 16 MiB each.
    slack = 2 * 8 * len(received)  # two messages, (ranks - 1) elements of at most 8 bytes
    assert all(b > 2 * contracts.LARGE_MESSAGE_BYTES - slack for b in received), received


@pytest.mark.usefixtures("numerical")
def test_every_collective_above_socket_buffers(
    contract: Contract, torchcomms_backend: str, torchcomms_device: str
) -> None:
    if large.large_dtype(tuple(get_backend_class(torchcomms_backend).supported_dtypes)) is None:
        pytest.skip("the backend declares none of float32, float64, int32, int64")
    done = contract(
        "large_collectives", large.body_large_collectives, torchcomms_backend, torchcomms_device
    )
    assert all(len(d) >= 15 for d in done), done


@pytest.mark.usefixtures("numerical")
def test_split_creates_working_sub_communicators(
    contract: Contract,
    conformance_pool: RankPool,
    torchcomms_backend: str,
    torchcomms_device: str,
) -> None:
    results = contract("split", contracts.body_split, torchcomms_backend, torchcomms_device)
    assert len(results) == conformance_pool.world_size


@pytest.mark.usefixtures("numerical")
def test_batch_issues_all_before_waiting(
    contract: Contract, torchcomms_backend: str, torchcomms_device: str
) -> None:
    contract("batch", contracts.body_batch_ring, torchcomms_backend, torchcomms_device, 4096)


@pytest.mark.usefixtures("numerical")
def test_unanswered_receive_times_out(
    contract: Contract, torchcomms_backend: str, torchcomms_device: str, torchcomms_timeout: float
) -> None:
    results = contract(
        "recv_timeout",
        contracts.body_timeout,
        torchcomms_backend,
        torchcomms_device,
        1.0,
        max(2.0, torchcomms_timeout / 2),
    )
    first = results[0]
    rule = contracts.RULES["recv_timeout"]
    assert first["status"] == "TIMEDOUT", f"{rule}: {first}"
    assert first["seconds"] < 1.0 + 5, f"{rule}: {first}"
    assert first.get("after") == "refused", f"{rule}: {first}"


@pytest.mark.usefixtures("numerical")
def test_tags_are_matched_or_refused_and_any_source_names_the_sender(
    contract: Contract, torchcomms_backend: str, torchcomms_device: str
) -> None:
    rule = contracts.RULES["tags"]
    for r, seen in enumerate(
        contract(
            "tags",
            contracts.body_tags_and_any_source,
            torchcomms_backend,
            torchcomms_device,
            contracts.LARGE_MESSAGE_BYTES // 4 + 3,
        )
    ):
        if not seen["tags"]:
            assert seen.get("refused") is True, f"{rule}: rank {r}: {seen}"
        elif seen["any"] and r == 0:
            n = len(seen["senders"]) + 1
            assert seen["senders"] == list(range(1, n)), f"{rule}: {seen}"
            assert seen["tagged_any"] == [6.0, 5.0, n - 1], f"{rule}: {seen}"


def test_bad_input_is_refused_before_communication(
    contract: Contract, torchcomms_backend: str, torchcomms_device: str
) -> None:
    for messages in contract(
        "bad_input", contracts.body_bad_inputs, torchcomms_backend, torchcomms_device
    ):
        assert len(messages) == 8
        assert "was finalized" in messages[-1]


# -- device windows (#56): run where triton is installed -------------------------------------


def _device_contracts() -> Any:
    pytest.importorskip(
        "triton", reason="the device-window contracts run Triton kernels: pip install triton"
    )
    from torchcomms_core.testing import device_contracts

    return device_contracts


def _windows_or_skip(results: list[Any], backend: str) -> None:
    if any(r is None for r in results):
        pytest.skip(f"backend {backend!r} has no windows (method_support()['new_window'])")


@pytest.mark.usefixtures("numerical")
def test_device_put_and_signal_land_exactly(
    contract: Contract, torchcomms_backend: str, torchcomms_device: str
) -> None:
    dc = _device_contracts()
    results = contract(
        "device_exchange", dc.body_device_exchange, torchcomms_backend, torchcomms_device
    )
    _windows_or_skip(results, torchcomms_backend)
    rule = contracts.RULES["device_exchange"]
    for r in results:
        assert r["codes"] == [0] * r["n"] and r["exact"], f"{rule}: {r}"
        assert r["settled"] == [0, r["n"]], f"{rule}: {r}"


def test_device_calls_are_refused_before_anything_is_queued(
    contract: Contract, torchcomms_backend: str, torchcomms_device: str
) -> None:
    dc = _device_contracts()
    results = contract(
        "device_refusals", dc.body_device_refusals, torchcomms_backend, torchcomms_device
    )
    _windows_or_skip(results, torchcomms_backend)
    rule = contracts.RULES["device_refusals"]
    codes = [dc.L.E_RANK, dc.L.E_RANGE, dc.L.E_BUFFER, dc.L.E_SIGNAL_ID, dc.L.E_SIGNAL_ID]
    for r in results:
        assert r["codes"] == codes, f"{rule}: {r}"
        assert r["queued"] == 0 and r["untouched"], f"{rule}: {r}"
        assert r["raised"] == "CommInputError", f"{rule}: {r}"


@pytest.mark.usefixtures("numerical")
def test_device_wait_for_a_missing_signal_times_out(
    contract: Contract, torchcomms_backend: str, torchcomms_device: str
) -> None:
    dc = _device_contracts()
    results = contract(
        "device_timeout", dc.body_device_timeout, torchcomms_backend, torchcomms_device, 1.5
    )
    _windows_or_skip(results, torchcomms_backend)
    rule = contracts.RULES["device_timeout"]
    first = results[0]
    assert first["code"] == dc.L.E_TIMEOUT and first["elapsed"] < 1.5 + 5, f"{rule}: {first}"
    assert "CommTimeoutError" in first["message"], f"{rule}: {first}"
    assert "signal 0 from peer 1" in first["message"], f"{rule}: {first}"

"""The conformance suite: every API contract against the backend named on the command line.

Run: ``pytest --pyargs torchcomms_core.testing --torchcomms-backend NAME``.
"""

from __future__ import annotations

import pytest
import torch

from torchcomms_core._registry import get_backend_class
from torchcomms_core.testing import contracts
from torchcomms_core.testing.pool import RankPool
from torchcomms_core.testing.reference import DTYPES


def _declared_dtypes(backend: str) -> list[str]:
    declared = set(get_backend_class(backend).supported_dtypes)
    return [name for name, dtype in DTYPES.items() if dtype in declared]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "dtype_name" in metafunc.fixturenames:
        backend = metafunc.config.getoption("--torchcomms-backend")
        names = _declared_dtypes(backend) if backend else ["float32"]
        metafunc.parametrize("dtype_name", names)


@pytest.fixture
def numerical(torchcomms_backend: str) -> None:
    """Skip a numerical contract for a backend that does not really communicate (fake)."""
    if not get_backend_class(torchcomms_backend).communicates:
        pytest.skip(
            f"backend {torchcomms_backend!r} declares communicates=False: its results are "
            f"not a collective's, so only the API-shape contracts apply"
        )


def test_backend_resolves_and_can_run_here(torchcomms_backend: str, torchcomms_device: str) -> None:
    cls = get_backend_class(torchcomms_backend)
    ok, reason = cls.is_available()
    assert ok, f"backend {torchcomms_backend!r} cannot run here: {reason}"
    assert torch.device(torchcomms_device).type in cls.devices


@pytest.mark.parametrize("count", [0, 5])
def test_every_operation_has_the_api_shapes(
    conformance_pool: RankPool,
    torchcomms_backend: str,
    torchcomms_device: str,
    torchcomms_timeout: float,
    count: int,
) -> None:
    calls = conformance_pool.run(
        contracts.body_api_shapes,
        torchcomms_backend,
        torchcomms_device,
        count,
        timeout=torchcomms_timeout,
    )
    assert calls == [2 * 14 + 1] * conformance_pool.world_size


@pytest.mark.usefixtures("numerical")
def test_every_operation_on_every_declared_dtype(
    conformance_pool: RankPool,
    torchcomms_backend: str,
    torchcomms_device: str,
    torchcomms_timeout: float,
    dtype_name: str,
) -> None:
    conformance_pool.run(
        contracts.body_every_op,
        torchcomms_backend,
        torchcomms_device,
        dtype_name,
        7,
        timeout=torchcomms_timeout,
    )


@pytest.mark.usefixtures("numerical")
@pytest.mark.parametrize("count", [0, 1, 1000])
def test_every_operation_at_edge_counts(
    conformance_pool: RankPool,
    torchcomms_backend: str,
    torchcomms_device: str,
    torchcomms_timeout: float,
    count: int,
) -> None:
    conformance_pool.run(
        contracts.body_every_op,
        torchcomms_backend,
        torchcomms_device,
        "float32",
        count,
        timeout=torchcomms_timeout,
    )


@pytest.mark.usefixtures("numerical")
def test_split_creates_working_sub_communicators(
    conformance_pool: RankPool,
    torchcomms_backend: str,
    torchcomms_device: str,
    torchcomms_timeout: float,
) -> None:
    results = conformance_pool.run(
        contracts.body_split, torchcomms_backend, torchcomms_device, timeout=torchcomms_timeout
    )
    assert len(results) == conformance_pool.world_size


@pytest.mark.usefixtures("numerical")
def test_batch_issues_all_before_waiting(
    conformance_pool: RankPool,
    torchcomms_backend: str,
    torchcomms_device: str,
    torchcomms_timeout: float,
) -> None:
    conformance_pool.run(
        contracts.body_batch_ring,
        torchcomms_backend,
        torchcomms_device,
        4096,
        timeout=torchcomms_timeout,
    )


@pytest.mark.usefixtures("numerical")
def test_unanswered_receive_times_out(
    conformance_pool: RankPool, torchcomms_backend: str, torchcomms_device: str
) -> None:
    results = conformance_pool.run(
        contracts.body_timeout, torchcomms_backend, torchcomms_device, 1.0, timeout=60
    )
    first = results[0]
    assert first["status"] == "TIMEDOUT", first
    assert first["seconds"] < 1.0 + 5, first
    assert first.get("after") == "refused", first


def test_bad_input_is_refused_before_communication(
    conformance_pool: RankPool,
    torchcomms_backend: str,
    torchcomms_device: str,
    torchcomms_timeout: float,
) -> None:
    for messages in conformance_pool.run(
        contracts.body_bad_inputs, torchcomms_backend, torchcomms_device, timeout=torchcomms_timeout
    ):
        assert len(messages) == 8
        assert "was finalized" in messages[-1]

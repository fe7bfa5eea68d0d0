"""Shared fixtures: session-wide pools of live gloo ranks (2 and 4)."""

from __future__ import annotations

import os
import sys

import pytest

from torchcomms_core.testing import RankPool

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # rank processes import test bodies from this folder
    sys.path.insert(0, HERE)

_pools: dict[int, RankPool] = {}


def _pool(size: int) -> RankPool:
    pool = _pools.get(size)
    if pool is None:
        pool = _pools[size] = RankPool(size, comm_timeout_s=30)
    return pool


@pytest.fixture(scope="session")
def pool2() -> RankPool:
    return _pool(2)


@pytest.fixture(scope="session")
def pool4() -> RankPool:
    return _pool(4)


@pytest.fixture(params=[2, 4], ids=["2ranks", "4ranks"])
def pool(request: pytest.FixtureRequest) -> RankPool:
    """Each test using it runs once at 2 ranks and once at 4."""
    return _pool(request.param)


_mpi_pools: dict[int, RankPool] = {}


def mpi_ranks(size: int) -> RankPool:
    """The session's pool of ``size`` ranks started by mpiexec; skips the test without it."""
    from torchcomms_core.testing.mpi_launch import mpiexec_unavailable

    missing = mpiexec_unavailable()
    if missing:
        pytest.skip(f"needs mpiexec: {missing}")
    pool = _mpi_pools.get(size)
    if pool is None:
        pool = _mpi_pools[size] = RankPool(size, comm_timeout_s=30, launcher="mpiexec")
    return pool


@pytest.fixture(params=[2, 4], ids=["mpi2ranks", "mpi4ranks"])
def mpi_pool(request: pytest.FixtureRequest) -> RankPool:
    """Ranks started by mpiexec (for the mpi backend), at 2 and 4; skips where it cannot."""
    return mpi_ranks(request.param)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for pool in (*_pools.values(), *_mpi_pools.values()):
        pool.close()
    _pools.clear()
    _mpi_pools.clear()

"""The conformance suite's pytest plugin (``pytest11`` entry point): inert unless asked.

``pytest --pyargs torchcomms_core.testing --torchcomms-backend NAME`` runs every API
contract against an installed backend on spawned ranks and reports native/derived methods.
"""

from __future__ import annotations

from typing import Any

import pytest

from .pool import RankPool


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchcomms", "torchcomms backend conformance suite")
    group.addoption("--torchcomms-backend", default=None, metavar="NAME",
                    help="backend to check with `pytest --pyargs torchcomms_core.testing`")
    group.addoption("--torchcomms-world-size", type=int, default=2, metavar="N",
                    help="ranks to spawn (default 2)")
    group.addoption("--torchcomms-device", default="cpu", metavar="DEVICE",
                    help="device type the communicators use (default cpu)")
    group.addoption("--torchcomms-timeout", type=float, default=120.0, metavar="SECONDS",
                    help="time limit of one contract body on all ranks (default 120)")
    group.addoption("--torchcomms-launcher", choices=("auto", "spawn", "mpiexec"),
                    default="auto",
                    help="how ranks start: spawned processes, or MPI processes under mpiexec; "
                         "auto (default) uses what the backend declares (mpi: mpiexec)")


_pools: dict[int, RankPool] = {}


@pytest.fixture(scope="session")
def torchcomms_backend(request: pytest.FixtureRequest) -> str:
    """The backend under test; the conformance tests skip without --torchcomms-backend."""
    name = request.config.getoption("--torchcomms-backend")
    if not name:
        pytest.skip("conformance suite: pass --torchcomms-backend NAME to run it")
    return str(name)


@pytest.fixture(scope="session")
def torchcomms_device(request: pytest.FixtureRequest) -> str:
    return str(request.config.getoption("--torchcomms-device"))


@pytest.fixture(scope="session")
def torchcomms_timeout(request: pytest.FixtureRequest) -> float:
    return float(request.config.getoption("--torchcomms-timeout"))


@pytest.fixture(scope="session")
def conformance_pool(request: pytest.FixtureRequest, torchcomms_backend: str) -> RankPool:
    """Live ranks for the contract bodies (one pool per session)."""
    size = int(request.config.getoption("--torchcomms-world-size"))
    if size < 2:
        raise pytest.UsageError("--torchcomms-world-size must be at least 2")
    launcher = str(request.config.getoption("--torchcomms-launcher"))
    if launcher == "auto":
        from .._registry import get_backend_class

        launcher = get_backend_class(torchcomms_backend).launcher or "spawn"
    if launcher == "mpiexec":
        from .mpi_launch import mpiexec_unavailable

        missing = mpiexec_unavailable()
        if missing:
            pytest.skip(f"conformance suite under mpiexec: {missing}")
    pool = _pools.get(size)
    if pool is None:
        pool = _pools[size] = RankPool(size, comm_timeout_s=60, launcher=launcher)
    return pool


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for pool in _pools.values():
        pool.close()
    _pools.clear()


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    name = config.getoption("--torchcomms-backend", default=None)
    if not name:
        return None
    return [f"torchcomms conformance: backend {name!r}, "
            f"{config.getoption('--torchcomms-world-size')} ranks, "
            f"device {config.getoption('--torchcomms-device')}, "
            f"launcher {config.getoption('--torchcomms-launcher')}"]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config
                            ) -> None:
    name = config.getoption("--torchcomms-backend", default=None)
    if not name:
        return
    from .._registry import get_backend_class
    from ..spec import method_support

    try:
        cls = get_backend_class(name)
    except Exception as exc:  # already reported by the failing tests
        terminalreporter.write_line(f"torchcomms: cannot load backend {name!r}: {exc}")
        return
    support = method_support(cls)
    size = config.getoption("--torchcomms-world-size")
    terminalreporter.section(f"torchcomms backend {name!r} at {size} ranks: native vs derived "
                             f"methods")
    for kind in ("native", "derived", "unsupported"):
        names = sorted(m for m, v in support.items() if v == kind)
        terminalreporter.write_line(f"{kind:>11}: {', '.join(names) if names else '-'}")
    dtypes = ", ".join(str(d).replace("torch.", "") for d in cls.supported_dtypes)
    ops = ", ".join(sorted(t.name for t in cls.supported_reduce_ops))
    terminalreporter.write_line(f"     dtypes: {dtypes}")
    terminalreporter.write_line(f" reduce ops: {ops} (+ AVG, PREMUL_SUM derived by the core)")

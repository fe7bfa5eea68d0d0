"""torchcomms' pytest plugin (``pytest11`` entry point): rank-pool fixtures and the
conformance suite; inert unless asked.

``pytest --pyargs torchcomms_core.testing --torchcomms-backend NAME`` runs every API
contract against an installed backend on spawned ranks and reports native/derived methods.

Any test suite (a backend's own, for instance) can also ask for live ranks; every fixture
hands out a :class:`~torchcomms_core.testing.RankPool` whose ranks start on first use, are
shared by the whole session, and are closed once when it ends:

``pool2``, ``pool4``
    Two and four spawned ranks (communicator timeout 30 s).
``pool``
    Parametrized: each test using it runs once at 2 ranks and once at 4.
``mpi_pool``
    Parametrized likewise over ranks started by ``mpiexec`` (for backends such as mpi);
    skips the test where ``mpiexec`` or ``mpi4py`` is missing.
``conformance_pool``
    The conformance suite's ranks, sized and launched by the ``--torchcomms-*`` options.

Outside a fixture, :func:`shared_pool` and :func:`mpi_ranks` return the same cached pools.
A fixture of the same name in a ``conftest.py`` overrides any of these, as usual in pytest.
"""

from __future__ import annotations

from typing import Any

import pytest

from torchcomms_core.testing.pool import RankPool


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchcomms", "torchcomms backend conformance suite")
    group.addoption(
        "--torchcomms-backend",
        default=None,
        metavar="NAME",
        help="backend to check with `pytest --pyargs torchcomms_core.testing`",
    )
    group.addoption(
        "--torchcomms-world-size",
        type=int,
        default=2,
        metavar="N",
        help="ranks to spawn (default 2)",
    )
    group.addoption(
        "--torchcomms-device",
        default="cpu",
        metavar="DEVICE",
        help="device type the communicators use (default cpu)",
    )
    group.addoption(
        "--torchcomms-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="time limit of one contract body on all ranks (default 120); a contract still "
        "running then is reported with every rank's stack and stops the run. Operations "
        "time out after half of it",
    )
    group.addoption(
        "--torchcomms-launcher",
        choices=("auto", "spawn", "mpiexec"),
        default="auto",
        help="how ranks start: spawned processes, or MPI processes under mpiexec; "
        "auto (default) uses what the backend declares (mpi: mpiexec)",
    )
    group.addoption(
        "--torchcomms-rank-env",
        action="append",
        default=[],
        metavar="RANKS:KEY=VALUE",
        help="set an environment variable in some ranks only, e.g. 0,1:TORCHCOMM_HOST_ID=a "
        "(repeatable; spawned ranks only)",
    )


def parse_rank_env(items: list[str], size: int) -> dict[int, dict[str, str]]:
    """``["0,1:KEY=VALUE", ...]`` as ``{rank: {KEY: VALUE}}``; a usage error names a bad item."""
    found: dict[int, dict[str, str]] = {}
    for item in items:
        ranks, sep, assignment = item.partition(":")
        key, eq, value = assignment.partition("=")
        try:
            numbers = [int(r) for r in ranks.split(",")]
        except ValueError:
            numbers = []
        if not sep or not eq or not key or not numbers or not all(0 <= r < size for r in numbers):
            raise pytest.UsageError(
                f"--torchcomms-rank-env {item!r}: expected RANKS:KEY=VALUE with ranks in "
                f"0..{size - 1}, e.g. 0,1:TORCHCOMM_HOST_ID=a"
            )
        for r in numbers:
            found.setdefault(r, {})[key] = value
    return found


#: Every pool handed out in this session, by (ranks, launcher, communicator timeout,
#: per-rank environment).
_pools: dict[tuple[int, str, float, str], RankPool] = {}


def shared_pool(
    size: int,
    *,
    launcher: str = "spawn",
    comm_timeout_s: float = 30.0,
    rank_env: dict[int, dict[str, str]] | None = None,
) -> RankPool:
    """The session's pool of ``size`` ranks started by ``launcher``, created on first use.

    It lives until the session ends; a body that fails recycles its ranks (see
    :class:`RankPool`), so later tests still get working ones. ``rank_env`` sets
    variables in single ranks (:class:`RankPool`).
    """
    key = (size, launcher, float(comm_timeout_s), repr(sorted((rank_env or {}).items())))
    pool = _pools.get(key)
    if pool is None:
        pool = _pools[key] = RankPool(
            size, comm_timeout_s=comm_timeout_s, launcher=launcher, rank_env=rank_env
        )
    return pool


def mpi_ranks(size: int) -> RankPool:
    """The session's pool of ``size`` ranks started by mpiexec; skips the test without it."""
    from torchcomms_core.testing.mpi_launch import mpiexec_unavailable

    missing = mpiexec_unavailable()
    if missing:
        pytest.skip(f"needs mpiexec: {missing}")
    return shared_pool(size, launcher="mpiexec")


@pytest.fixture(scope="session")
def pool2() -> RankPool:
    """Two spawned ranks, shared by the session."""
    return shared_pool(2)


@pytest.fixture(scope="session")
def pool4() -> RankPool:
    """Four spawned ranks, shared by the session."""
    return shared_pool(4)


@pytest.fixture(params=[2, 4], ids=["2ranks", "4ranks"])
def pool(request: pytest.FixtureRequest) -> RankPool:
    """Each test using it runs once at 2 ranks and once at 4."""
    return shared_pool(request.param)


@pytest.fixture(params=[2, 4], ids=["mpi2ranks", "mpi4ranks"])
def mpi_pool(request: pytest.FixtureRequest) -> RankPool:
    """Ranks started by mpiexec (for the mpi backend), at 2 and 4; skips where it cannot."""
    return mpi_ranks(request.param)


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
        from torchcomms_core.plugin_host.backends import get_backend_class

        launcher = get_backend_class(torchcomms_backend).launcher or "spawn"
    if launcher == "mpiexec":
        from torchcomms_core.testing.mpi_launch import mpiexec_unavailable

        missing = mpiexec_unavailable()
        if missing:
            pytest.skip(f"conformance suite under mpiexec: {missing}")
    # Operations time out within the body's limit, so a rank stuck in one reports it
    # itself (with its traceback) before the pool declares the body hung.
    timeout = float(request.config.getoption("--torchcomms-timeout"))
    if timeout <= 0:
        raise pytest.UsageError("--torchcomms-timeout must be a positive number of seconds")
    rank_env = parse_rank_env(request.config.getoption("--torchcomms-rank-env"), size)
    if rank_env and launcher != "spawn":
        raise pytest.UsageError("--torchcomms-rank-env needs spawned ranks, not mpiexec")
    return shared_pool(
        size, launcher=launcher, comm_timeout_s=max(1.0, timeout / 2), rank_env=rank_env
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Close every pool of the session, once."""
    pools = list(_pools.values())
    _pools.clear()
    for pool in pools:
        pool.close()


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    name = config.getoption("--torchcomms-backend", default=None)
    if not name:
        return None
    return [
        f"torchcomms conformance: backend {name!r}, "
        f"{config.getoption('--torchcomms-world-size')} ranks, "
        f"device {config.getoption('--torchcomms-device')}, "
        f"launcher {config.getoption('--torchcomms-launcher')}"
    ] + [f"  rank environment: {item}" for item in config.getoption("--torchcomms-rank-env")]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    name = config.getoption("--torchcomms-backend", default=None)
    if not name:
        return
    from torchcomms_core.plugin_host.backends import get_backend_class
    from torchcomms_core.spec import (
        DERIVABLE_METHODS,
        OPTIONAL_METHODS,
        REQUIRED_METHODS,
        method_support,
    )

    try:
        cls = get_backend_class(name)
    except Exception as exc:  # already reported by the failing tests
        terminalreporter.write_line(f"torchcomms: cannot load backend {name!r}: {exc}")
        return
    support = method_support(cls)
    size = config.getoption("--torchcomms-world-size")
    terminalreporter.section(
        f"torchcomms backend {name!r} at {size} ranks: native vs derived methods"
    )
    spec = {*REQUIRED_METHODS, *DERIVABLE_METHODS, *OPTIONAL_METHODS}
    for kind in ("native", "derived", "unsupported", "missing"):
        names = sorted(m for m, v in support.items() if v == kind and m in spec)
        if names or kind != "missing":
            terminalreporter.write_line(f"{kind:>11}: {', '.join(names) if names else '-'}")
    plugins = ", ".join(f"{m} ({v})" for m, v in sorted(support.items()) if m not in spec)
    terminalreporter.write_line(f"    plugins: {plugins or '-'}")
    dtypes = ", ".join(str(d).replace("torch.", "") for d in cls.supported_dtypes)
    ops = ", ".join(sorted(t.name for t in cls.supported_reduce_ops))
    terminalreporter.write_line(f"     dtypes: {dtypes}")
    terminalreporter.write_line(f" reduce ops: {ops} (+ AVG, PREMUL_SUM derived by the core)")

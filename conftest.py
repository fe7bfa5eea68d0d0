"""What this repository's tests add to torchcomms' pytest plugin, for every test folder.

The rank-pool fixtures (``pool2``, ``pool4``, ``pool``, ``mpi_pool``) come from the shipped
plugin, ``torchcomms_core.testing.plugin``; ``mpi_ranks`` is re-exported for test modules
that build their own parametrization around it. Being at the repository root, this file
serves ``tests/<subject>/`` and every ``plugins/<name>/tests/`` alike (tests/README.md).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import pytest

from torchcomms_core.testing import plugin
from torchcomms_core.testing.plugin import mpi_ranks

__all__ = ["mpi_ranks"]

# Shared helper modules (memory_backend) live in tests/; test modules import them by name,
# and rank processes import test bodies by module name from their folders (pytest puts each
# test file's folder on sys.path, and spawned ranks inherit it).
HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests")
if HELPERS not in sys.path:
    sys.path.insert(0, HELPERS)

# Tests run on the backends' default rules: a tuning table that `torchcomms tune` wrote on
# this machine (#45) is read only where a test points at one (rank processes inherit this).
os.environ.setdefault("TORCHCOMM_TUNING_DIR", tempfile.mkdtemp(prefix="torchcomms-no-tables-"))


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.is_registered(plugin):
        raise pytest.UsageError(
            "torchcomms' pytest plugin is not loaded, so the rank-pool fixtures are missing: "
            "drop -p no:torchcomms, or with PYTEST_DISABLE_PLUGIN_AUTOLOAD set add "
            "-p torchcomms_core.testing.plugin (it loads through the pytest11 entry point of "
            "the installed package: pip install -e .)"
        )


# -- nothing left behind in /dev/shm -----------------------------------------------------

#: Set to 0 to skip the check (another job writes /dev/shm on this machine meanwhile).
SHM_CHECK = "TORCHCOMM_SHM_CHECK"
SHM_DIR = "/dev/shm"
#: Seconds a leftover gets to disappear (a rank still exiting) before it counts.
SHM_GRACE_S = 5.0
#: Set by the outermost session: pytest runs nested in it (the conformance suite's own
#: sessions) leave the check to it, which sees everything they leave.
SHM_OUTER = "TORCHCOMM_SHM_CHECK_OUTER"
#: Python's multiprocessing keeps its named semaphores (``sem.mp-*``) here and its
#: resource tracker removes them; they are not ours to account for.
SHM_IGNORED_PREFIXES = ("sem.",)
_shm_before: dict[str, float] = {}
_shm_start = 0.0
_shm_outer = False


def _shm_listing() -> dict[str, float]:
    found: dict[str, float] = {}
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return found
    for name in names:
        try:
            found[name] = os.stat(os.path.join(SHM_DIR, name)).st_ctime
        except OSError:
            continue
    return found


def _mapped_shm() -> set[str]:
    """Names in /dev/shm that a live process maps (a job still running, ours or not)."""
    mapped: set[str] = set()
    prefix = SHM_DIR + "/"
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                for line in f:
                    at = line.find(prefix)
                    if at >= 0:
                        mapped.add(line[at + len(prefix) :].split()[0])
        except OSError:
            continue
    return mapped


def shm_leftovers(before: dict[str, float], since: float) -> list[str]:
    """Entries of /dev/shm made since ``since`` that ``before`` did not list and that no
    live process maps (those belong to a job still running, on a shared machine)."""
    new = {
        n
        for n, made in _shm_listing().items()
        if n not in before and made >= since - 1.0 and not n.startswith(SHM_IGNORED_PREFIXES)
    }
    return sorted(new - _mapped_shm()) if new else []


def pytest_sessionstart(session: pytest.Session) -> None:
    global _shm_start, _shm_outer
    _shm_outer = SHM_OUTER not in os.environ
    os.environ.setdefault(SHM_OUTER, str(os.getpid()))
    _shm_start = time.time()
    _shm_before.update(_shm_listing())


@pytest.hookimpl(trylast=True)  # after torchcomms' plugin closed the rank pools
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if (
        os.environ.get(SHM_CHECK, "1") == "0"
        or hasattr(session.config, "workerinput")
        or not _shm_outer
    ):
        return
    deadline = time.monotonic() + SHM_GRACE_S
    left = shm_leftovers(_shm_before, _shm_start)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = shm_leftovers(_shm_before, _shm_start)
    if not left:
        return
    sizes = []
    for name in left:
        try:
            sizes.append(f"{name} ({os.path.getsize(os.path.join(SHM_DIR, name))} bytes)")
        except OSError:
            sizes.append(name)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = (
        f"the tests left {len(left)} file(s) in {SHM_DIR} that were not there before: "
        f"{', '.join(sizes)}. A test must remove what it creates there (kill no rank before "
        f"it cleans up); set {SHM_CHECK}=0 only where other jobs write {SHM_DIR} meanwhile"
    )
    if reporter is not None:
        reporter.write_line(message, red=True)
    else:
        sys.stderr.write(message + "\n")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# The quick tier (`pytest -m quick`): a newcomer's first run, a few minutes on 2 cores,
# touching the core and every plugin with real ranks. Each entry is a test file and the
# names (substrings of the test id) taken from it; an empty tuple takes the whole file.
# CI runs everything; tests/README.md says how the tier is chosen.
QUICK: dict[str, tuple[str, ...]] = {
    "tests/communicator/test_core_unit.py": (),
    "tests/communicator/test_hints.py": (),
    "tests/plugins/test_plugin_errors.py": (),
    "tests/plugins/test_fake_backend.py": (),
    "tests/bridge/test_bridge_parity.py": ("all_reduce",),
    "tests/bridge/test_c10d_backend_names.py": ("[shm-plain-2]", "normalises"),
    "plugins/torchcomms_gloo/tests/test_gloo_comm.py": (),
    "plugins/torchcomms_shm/tests/test_shm_backend.py": ("uneven_messages", "[2-1-all_reduce]"),
    "plugins/torchcomms_hier/tests/test_hier_example.py": (),
    "plugins/torchcomms_mpi/tests/test_mpi_backend.py": ("results_land", "without_mpiexec"),
    "plugins/torchcomms_quantized/tests/test_quantized.py": ("bound",),
    "plugins/torchcomms_nixl/tests/test_nixl_transport.py": ("write",),
    "plugins/torchcomms_ncclx/tests/test_ncclx_engine.py": (),
    "plugins/torchcomms_rccl/tests/test_rccl_backend.py": (),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = str(config.rootpath)
    for item in items:
        path = os.path.relpath(str(item.path), root)
        names = QUICK.get(path)
        if names is None:
            continue
        if not names or any(n in item.name for n in names):
            item.add_marker(pytest.mark.quick)

"""What this repository's tests add to torchcomms' pytest plugin, for every test folder.

The rank-pool fixtures (``pool2``, ``pool4``, ``pool``, ``mpi_pool``) come from the shipped
plugin, ``torchcomms_core.testing.plugin``; ``mpi_ranks`` is re-exported for test modules
that build their own parametrization around it. Being at the repository root, this file
serves ``tests/<subject>/`` and every ``plugins/<name>/tests/`` alike (tests/README.md).
"""

from __future__ import annotations

import os
import sys

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


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.is_registered(plugin):
        raise pytest.UsageError(
            "torchcomms' pytest plugin is not loaded, so the rank-pool fixtures are missing: "
            "drop -p no:torchcomms, or with PYTEST_DISABLE_PLUGIN_AUTOLOAD set add "
            "-p torchcomms_core.testing.plugin (it loads through the pytest11 entry point of "
            "the installed package: pip install -e .)"
        )


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

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

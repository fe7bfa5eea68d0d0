"""PyTorch's own ``DistributedTest`` suite, wired as torch's ``test_distributed_spawn.py`` wires it.

Not collected by the project's pytest run (its name does not start with ``test_``);
``scripts/torch_suite.py`` runs it with the environment the suite reads (``BACKEND``,
``WORLD_SIZE``, ``TEMP_DIR``) and, for the bridged run, ``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1``;
``TORCHCOMMS_SUITE_START`` picks how ranks start (``spawn``, as torch does, or ``fork``).
"""

from __future__ import annotations

import os

import torch
from torch.testing._internal.distributed.distributed_test import (
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """Every test of ``_DistTestBase``, each run in ``WORLD_SIZE`` spawned processes."""

    def setUp(self) -> None:
        super().setUp()
        # torch's test_distributed_spawn.py spawns; forking (TORCHCOMMS_SUITE_START=fork)
        # starts each rank without importing torch again, several times faster here. The
        # baseline and the gated run use the same start method.
        if os.environ.get("TORCHCOMMS_SUITE_START", "spawn") == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()

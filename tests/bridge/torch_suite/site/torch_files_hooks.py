"""Hooks for running PyTorch's own distributed test files (``scripts/torch_dist_files.py``).

* ``MultiThreadedTestCase`` runs ``init_process_group`` outside the ``try`` that reports a
  rank's errors: an error there kills the rank's thread, the test framework never hears
  of it, and the test "passes" without having run. The hook reports such an error as the
  test's failure, and prints it.
* ``TORCHCOMMS_TORCH_FILES_WORLD_SIZE=N`` sets the world size of the tests that take the
  framework's default (``DEFAULT_WORLD_SIZE``, DTensor's ``NUM_DEVICES``); tests that set
  their own keep it.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def install() -> None:
    """Install both hooks (idempotent)."""
    from torch.testing._internal import common_distributed as cd

    size = os.environ.get("TORCHCOMMS_TORCH_FILES_WORLD_SIZE")
    if size:
        cd.DEFAULT_WORLD_SIZE = int(size)
        try:
            from torch.testing._internal.distributed._tensor import common_dtensor
        except ImportError:
            pass
        else:
            common_dtensor.NUM_DEVICES = int(size)

    cls = cd.MultiThreadedTestCase
    original = cls.run_test_with_threaded_pg
    if getattr(original, "__torchcomms_hooked__", False):
        return

    def run_test_with_threaded_pg(self: Any, test_name: str, rank: int, world_size: int) -> Any:
        try:
            return original(self, test_name, rank, world_size)
        except BaseException as exc:
            # The test body's own errors were queued by the framework; this one was raised
            # around it (init_process_group, set-up, tear-down) and would be lost.
            print(
                f"[torch_files_hooks] {type(self).__name__}.{test_name} rank {rank}: error "
                f"outside the test body, which MultiThreadedTestCase would swallow: "
                f"{type(exc).__name__}: {exc}",
                file=sys.stderr,
                flush=True,
            )
            cls.exception_queue.put((rank, sys.exc_info()))
            from torch.testing._internal.distributed.multi_threaded_pg import (
                ProcessLocalGroup,
            )

            ProcessLocalGroup.exception_handle(exc)  # wake the other ranks
            return None

    run_test_with_threaded_pg.__torchcomms_hooked__ = True  # type: ignore[attr-defined]
    cls.run_test_with_threaded_pg = run_test_with_threaded_pg  # type: ignore[method-assign]

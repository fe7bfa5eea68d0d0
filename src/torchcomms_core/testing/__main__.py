"""``python -m torchcomms_core.testing --torchcomms-backend NAME``: run the conformance suite.

The same as ``pytest --pyargs torchcomms_core.testing ...`` with this interpreter, and
the ``--torchcomms-*`` options always understood: where pytest is missing it says which
extra installs it, and where pytest's plugin autoloading is off (or the package is used
from a source tree without its entry points) it loads torchcomms' pytest plugin itself.
Any other pytest option passes through (``-x``, ``-k``, ``-v``).
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import sys
from collections.abc import Sequence

#: What installs the suite's only extra requirement.
INSTALL = 'pip install "torchcomms-core[conformance]"'
PLUGIN = "torchcomms_core.testing.plugin"


def _plugin_autoloads() -> bool:
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    return any(ep.value == PLUGIN for ep in metadata.entry_points(group="pytest11"))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite with ``argv`` (default ``sys.argv[1:]``); return pytest's exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        import pytest
    except ImportError:
        sys.stderr.write(
            "torchcomms conformance suite: pytest is not installed in this environment "
            f"({sys.executable}); install the suite's requirements with\n    {INSTALL}\n"
        )
        return 2
    plugin = [] if _plugin_autoloads() else ["-p", PLUGIN]
    # This module imported torchcomms_core before pytest could mark it for assertion
    # rewriting; the suite's own test module is still rewritten.
    quiet = ["-W", "ignore:Module already imported so cannot be rewritten"]
    return int(pytest.main([*plugin, *quiet, "--pyargs", "torchcomms_core.testing", *args]))


if __name__ == "__main__":
    sys.exit(main())

"""``python -m torchcomms_core.cli``: the ``torchcomms`` command without the console script.

For example ``python -m torchcomms_core.cli bench --nproc 2 -e 1M``.
"""

from __future__ import annotations

import sys

from torchcomms_core.cli import main

if __name__ == "__main__":
    sys.exit(main())

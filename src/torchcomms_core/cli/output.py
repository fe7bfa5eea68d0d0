"""What the listing subcommands print: JSON for scripts, a hint when nothing is installed,
aligned tables. Imports nothing of torchcomms.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any


def print_json_or_none(rows: list[Any], as_json: bool, what: str, suggestion: str) -> bool:
    """Print ``rows`` as JSON (``--json``), or say that no ``what`` is installed and suggest
    ``pip install suggestion``; return whether anything was printed (nothing is left to do)."""
    if as_json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return True
    if not rows:
        print(f"no torchcomms {what} installed; try `pip install {suggestion}`")
        return True
    return False


def print_table(rows: Sequence[tuple[str, ...]]) -> None:
    """Print ``rows`` (the first is the header) in aligned columns, the header underlined."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for k, row in enumerate(rows):
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))

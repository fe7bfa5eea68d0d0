"""List installed transports (``torchcomms.transports``): distribution, version, devices, and
whether they can run here; the one ``torchcomms._transport`` uses is marked.
"""

from __future__ import annotations

import argparse
import json
import sys

from torchcomms_core.cli.backends import print_table

HELP = "list installed transports (one-sided read/write) and whether they run here"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def run(args: argparse.Namespace) -> int:
    from torchcomms_core.comm.transport import describe_transports

    rows = describe_transports()
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not rows:
        print("no torchcomms transports installed; try `pip install torchcomms-nixl`")
        return 0
    table = [("transport", "distribution", "version", "spec", "devices", "runs here", "used")]
    for r in rows:
        table.append(
            (
                r["name"],
                r["distribution"] or "?",
                r["version"],
                r["spec_version"],
                ",".join(r["devices"]) or "-",
                "yes" if r["runnable"] else f"no: {r['reason']}",
                "yes" if r["selected"] else "",
            )
        )
    print_table(table)
    return 0

"""List installed transports (``torchcomms.transports``): distribution, version, devices, and
whether they can run here; the one ``torchcomms._transport`` uses is marked.
"""

from __future__ import annotations

import argparse

from torchcomms_core.cli.output import print_json_or_none, print_table

HELP = "list installed transports (one-sided read/write) and whether they run here"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def run(args: argparse.Namespace) -> int:
    from torchcomms_core.plugin_host.transports import describe_transports

    rows = describe_transports()
    if print_json_or_none(rows, args.json, "transports", "torchcomms-nixl"):
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

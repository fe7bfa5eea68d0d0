"""List installed tuners (``torchcomms.tuners``): distribution, version, whether they run
here; the one communicators ask (``TORCHCOMM_TUNER``, else the built-in ``table``) is marked.
"""

from __future__ import annotations

import argparse

from torchcomms_core.cli.output import print_json_or_none, print_table

HELP = "list installed tuners (they choose each backend's algorithms) and which one is used"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def run(args: argparse.Namespace) -> int:
    from torchcomms_core.plugin_host.tuners import describe_tuners

    rows = describe_tuners()
    if print_json_or_none(rows, args.json, "tuners", "a tuner plugin"):
        return 0
    table = [("tuner", "distribution", "version", "runs here", "used")]
    for r in rows:
        table.append(
            (
                r["name"],
                r["distribution"] or "?",
                r["version"],
                "yes" if r["runnable"] else f"no: {r['reason']}",
                "yes" if r["selected"] else "",
            )
        )
    print_table(table)
    return 0

"""List torchcomms plugins: what each distribution provides and whether it loaded.

Honours TORCHCOMM_DISABLE_PLUGIN_AUTOLOAD and TORCHCOMM_PLUGINS like communicators do.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from torchcomms_core.cli.output import print_table

HELP = "list extension plugins and the collectives they add"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def run(args: argparse.Namespace) -> int:
    from torchcomms_core.plugin_host.manager import PluginError, list_collectives, plugin_records

    try:
        records = plugin_records()
    except PluginError as exc:  # two plugins claim one collective: say so, not a traceback
        args.parser.error(str(exc))
    if args.json:
        json.dump(
            {
                "plugins": [dataclasses.asdict(r) for r in records],
                "collectives": list_collectives(),
            },
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")
        return 0
    table = [("plugin", "distribution", "version", "status", "provides")]
    for r in records:
        provides = ", ".join(r.collectives) or (r.error if r.status == "failed" else "-")
        table.append((r.name, r.distribution, r.version, r.status, provides))
    print_table(table)
    return 0

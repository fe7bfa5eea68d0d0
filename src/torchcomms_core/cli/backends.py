"""List installed backends: distribution, version, spec, devices, and whether they run here.

Each backend's plugin is imported to ask it; one that fails to import is listed as such.
"""

from __future__ import annotations

import argparse
from typing import Any

from torchcomms_core.cli.output import print_json_or_none, print_table

HELP = "list installed backends and whether they can run on this machine"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument(
        "--algorithms",
        action="store_true",
        help="also list each backend's declared algorithms per operation and default rules",
    )


def describe_backends() -> list[dict[str, Any]]:
    """One record per backend name (entry points and in-process registrations)."""
    from torchcomms_core.plugin_host import backends as registry
    from torchcomms_core.plugin_host.registry import runs_here
    from torchcomms_core.spec import (
        DERIVABLE_METHODS,
        OPTIONAL_METHODS,
        REQUIRED_METHODS,
        method_support,
    )

    spec_ops = {*REQUIRED_METHODS, *DERIVABLE_METHODS, *OPTIONAL_METHODS}

    entries = registry.entry_points()
    rows = []
    for name in registry.available_backends():
        entry = entries.get(name)
        row: dict[str, Any] = {
            "name": name,
            "distribution": entry.distribution if entry else "(registered in-process)",
            "version": entry.version if entry else "",
            "entry_point": entry.value if entry else "",
            # Other distributions registering the same name, and what is done about it.
            "also_registered_by": [e.provider for e in entry.others] if entry else [],
            "conflict": (
                registry.conflict_message(entry)
                if entry and (entry.others or entry.choice != "only")
                else ""
            ),
        }
        try:
            cls = registry.get_backend_class(name)
        except Exception as exc:  # report it; other backends keep working
            row.update(
                spec_version="?",
                devices=[],
                runnable=False,
                broken=True,
                reason=f"failed to load: {exc}",
                native=[],
                derived=[],
                plugin_collectives={},
                hint_keys=None,
                algorithms={},
            )
            rows.append(row)
            continue
        runnable, reason = runs_here(cls)
        support = method_support(cls)
        row.update(
            broken=False,
            spec_version=cls.spec_version,
            devices=list(cls.devices),
            runnable=runnable,
            reason="" if runnable else reason,
            native=sorted(m for m, v in support.items() if v == "native" and m in spec_ops),
            derived=sorted(m for m, v in support.items() if v == "derived" and m in spec_ops),
            # Collectives that plugins add: the backend's own method, or the plugin's.
            plugin_collectives={m: v for m, v in support.items() if m not in spec_ops},
            # The hint keys the backend reads (``None``: it does not declare them).
            hint_keys=list(cls.hint_keys) if cls.hint_keys is not None else None,
            # The algorithms it declares per operation, with their default rule (#45).
            algorithms={
                op: {k: v for k, v in entry.items() if k != "support"}
                for op, entry in method_support(cls, algorithms=True).items()
                if isinstance(entry, dict)
            },
        )
        rows.append(row)
    return rows


def run(args: argparse.Namespace) -> int:
    from torchcomms_core.foundation.errors import TorchCommError

    try:
        rows = describe_backends()
    except TorchCommError as exc:  # e.g. a malformed TORCHCOMM_BACKEND_OVERRIDE
        args.parser.error(str(exc))
    if print_json_or_none(rows, args.json, "backends", "torchcomms-gloo"):
        return 0
    table = [("backend", "distribution", "version", "spec", "devices", "runs here", "operations")]
    for r in rows:
        if r["broken"]:
            runs = "BROKEN (see below)"
        else:
            runs = "yes" if r["runnable"] else f"no: {r['reason']}"
        ops = f"{len(r['native'])} native, {len(r['derived'])} derived" if r["native"] else "-"
        dist = r["distribution"] or "?"
        if r["also_registered_by"]:
            dist += f" (conflict: also {', '.join(r['also_registered_by'])})"
        table.append(
            (
                r["name"],
                dist,
                r["version"] or "",
                r["spec_version"],
                ",".join(r["devices"]) or "-",
                runs,
                ops,
            )
        )
    print_table(table)
    for r in rows:
        if r["broken"]:
            print(f"\nbroken: {r['name']}: {r['reason']}")
    for r in rows:
        if r["conflict"]:
            print(f"\nconflict: {r['conflict']}")
    if getattr(args, "algorithms", False):
        print_algorithms(rows)
    return 0


def print_algorithms(rows: list[dict[str, Any]]) -> None:
    """One table of every backend's declared algorithms (``--algorithms``)."""
    table = [("backend", "operation", "algorithm", "parameters", "default rule", "what it does")]
    for r in rows:
        for op, spec in sorted(r.get("algorithms", {}).items()):
            for i, a in enumerate(spec["algorithms"]):
                params = ",".join(f"{k}={v}" for k, v in a["params"].items()) or "-"
                forced = (
                    f"; {', '.join(spec['forced_by'])} overrides the tuner"
                    if spec["forced_by"]
                    else ""
                )
                table.append(
                    (
                        r["name"] if i == 0 else "",
                        op if i == 0 else "",
                        a["name"],
                        params,
                        spec["default"] + forced if i == 0 else "",
                        a["doc"],
                    )
                )
    print()
    if len(table) == 1:
        print("no backend declares algorithms")
        return
    print_table(table)

"""List every installed torchcomms plugin, kind by kind: backends, transports, tuners and
extension plugins, each entry with its distribution, version and whether it loads.

``--kind`` lists one kind; ``torchcomms backends``, ``torchcomms transports`` and
``torchcomms tuners`` are this listing for their kind (``KINDS``). Listing imports each
plugin to ask it; one that fails is listed as such, and the others still are. Extension
plugins honour TORCHCOMM_DISABLE_PLUGIN_AUTOLOAD and TORCHCOMM_PLUGINS like communicators do.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

from torchcomms_core.cli.output import print_json_or_none, print_table

HELP = "list every installed plugin (backends, transports, tuners, extensions) and its status"


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of plugin as the listing shows it.

    ``name`` is its command and its key in ``--json``; ``group`` its entry-point group;
    ``describe`` gives its records (what its own command prints with ``--json``), ``table``
    prints them for people; ``suggestion`` is what to ``pip install`` when none is installed
    (empty: something always is); ``options`` adds the arguments only its own command takes.
    """

    name: str
    group: str
    help: str
    describe: Callable[[], Any]
    table: Callable[[Any, argparse.Namespace], None]
    suggestion: str = ""
    options: Callable[[argparse.ArgumentParser], None] | None = None


# -- backends --------------------------------------------------------------------------------


def _describe_backends() -> list[dict[str, Any]]:
    from torchcomms_core.plugin_host.backends import describe_backends

    return describe_backends()


def _backend_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--algorithms",
        action="store_true",
        help="also list each backend's declared algorithms per operation and default rules",
    )


def _backends_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
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


# -- transports and tuners -------------------------------------------------------------------


def _describe_transports() -> list[dict[str, Any]]:
    from torchcomms_core.plugin_host.transports import describe_transports

    return describe_transports()


def _describe_tuners() -> list[dict[str, Any]]:
    from torchcomms_core.plugin_host.tuners import describe_tuners

    return describe_tuners()


def _runs(r: dict[str, Any]) -> str:
    return "yes" if r["runnable"] else f"no: {r['reason']}"


def _transports_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    table = [("transport", "distribution", "version", "spec", "devices", "runs here", "used")]
    for r in rows:
        devices = ",".join(r["devices"]) or "-"
        used = "yes" if r["selected"] else ""
        dist = r["distribution"] or "?"
        table.append((r["name"], dist, r["version"], r["spec_version"], devices, _runs(r), used))
    print_table(table)


def _tuners_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    table = [("tuner", "distribution", "version", "runs here", "used")]
    for r in rows:
        used = "yes" if r["selected"] else ""
        table.append((r["name"], r["distribution"] or "?", r["version"], _runs(r), used))
    print_table(table)


# -- extension plugins (torchcomms.plugins) --------------------------------------------------


def _describe_extensions() -> dict[str, Any]:
    from torchcomms_core.plugin_host.manager import list_collectives, plugin_records

    return {
        "plugins": [dataclasses.asdict(r) for r in plugin_records()],
        "collectives": list_collectives(),
    }


def _extensions_table(found: dict[str, Any], args: argparse.Namespace) -> None:
    table = [("plugin", "distribution", "version", "status", "provides")]
    for r in found["plugins"]:
        provides = ", ".join(r["collectives"]) or (r["error"] if r["status"] == "failed" else "-")
        table.append((r["name"], r["distribution"], r["version"], r["status"], provides))
    print_table(table)


#: Every kind the listing shows, in the order it shows them.
KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind(
            "backends",
            "torchcomms.backends",
            "list installed backends and whether they can run on this machine",
            _describe_backends,
            _backends_table,
            "torchcomms-gloo",
            _backend_options,
        ),
        Kind(
            "transports",
            "torchcomms.transports",
            "list installed transports (one-sided read/write) and whether they run here",
            _describe_transports,
            _transports_table,
            "torchcomms-nixl",
        ),
        Kind(
            "tuners",
            "torchcomms.tuners",
            "list installed tuners (they choose each backend's algorithms) and which one is used",
            _describe_tuners,
            _tuners_table,
            "a tuner plugin",
        ),
        Kind(
            "plugins",
            "torchcomms.plugins",
            "list extension plugins and the collectives they add",
            _describe_extensions,
            _extensions_table,
        ),
    )
}


def _list(kind: Kind, args: argparse.Namespace) -> int:
    """List one kind, as its own command does; an error that keeps the whole kind from being
    listed (a malformed override, two plugins claiming one collective) exits with usage 2."""
    from torchcomms_core.foundation.errors import TorchCommError

    try:
        found = kind.describe()
    except TorchCommError as exc:
        args.parser.error(str(exc))
    if kind.suggestion:
        if print_json_or_none(found, args.json, kind.name, kind.suggestion):
            return 0
    elif args.json:
        json.dump(found, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    kind.table(found, args)
    return 0


def _list_all(args: argparse.Namespace) -> int:
    """Every kind under its heading (``--json``: one object, a key per kind); a kind that
    cannot be listed says why, the others are still listed, and the exit status is 1."""
    from torchcomms_core.foundation.errors import TorchCommError

    everything: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for k, kind in enumerate(KINDS.values()):
        try:
            found = kind.describe()
        except TorchCommError as exc:
            errors[kind.name] = str(exc)
            found = None
        if args.json:
            if found is not None:
                everything.update(found if isinstance(found, dict) else {kind.name: found})
            continue
        if k:
            print()
        print(f"{kind.name} (entry points {kind.group})")
        if found is None:
            print(f"cannot list {kind.name}: {errors[kind.name]}")
        elif not (kind.suggestion and print_json_or_none(found, False, kind.name, kind.suggestion)):
            kind.table(found, args)
    if args.json:
        if errors:
            everything["errors"] = errors
        json.dump(everything, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 1 if errors else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument(
        "--kind", choices=list(KINDS), help="list only this kind (as its own command does)"
    )


def run(args: argparse.Namespace) -> int:
    if args.kind is not None:
        return _list(KINDS[args.kind], args)
    return _list_all(args)


def listing_of(
    name: str,
) -> tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]:
    """``(HELP, add_arguments, run)`` of the command that lists kind ``name`` alone: this
    listing filtered to it, with the kind's own options."""
    kind = KINDS[name]

    def add_kind_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON for scripts")
        if kind.options is not None:
            kind.options(parser)

    def run_kind(args: argparse.Namespace) -> int:
        return _list(kind, args)

    return kind.help, add_kind_arguments, run_kind

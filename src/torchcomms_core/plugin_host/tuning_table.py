"""The built-in measuring tuner's table: one JSON file per backend and world size (#45).

``torchcomms tune --backend B --nproc N`` measures every declared algorithm over sizes and
writes ``<TORCHCOMM_TUNING_DIR>/<B>-np<N>.json`` (default directory
``~/.cache/torchcomms/tuning``). The file is meant to be read and edited by hand, like
Open MPI's ``coll/tuned`` rules file::

    {
      "format": "torchcomms-tuning/1",
      "host": "node17", "backend": "shm", "version": "0.9.0",
      "world_size": 4, "ranks_per_host": 4,
      "rules": [
        {"op": "all_reduce", "min_bytes": 0, "max_bytes": 65536,
         "algorithm": "staged", "params": {}, "measured": {"staged": 9.1, "direct": 14.0}},
        ...
      ]
    }

A rule applies to a query of its ``op`` whose size bucket (a power of two) lies in
``[min_bytes, max_bytes]``; the first rule that applies wins; ``measured`` (microseconds
per call, by candidate) is for the reader only. The :class:`TableTuner` (tuner ``table``,
the default) answers from the table of this host, backend and world size; a table written
for another host, backend, world size, ranks per host or backend version is ignored with
one warning, and with no table the backend's default rules decide.

Imports ``spec`` and ``foundation`` only.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from torchcomms_core.foundation import env as _env
from torchcomms_core.spec.tuning import Choice, Query, Tuner, TunerContext, report_once

__all__ = ["FORMAT", "TableTuner", "load_table", "table_path", "write_table"]

#: The ``format`` field of a table this core reads and writes.
FORMAT = "torchcomms-tuning/1"


def table_path(backend: str, world_size: int, directory: str | None = None) -> str:
    """Where the table of ``backend`` at ``world_size`` ranks lives."""
    return os.path.join(directory or _env.tuning_dir(), f"{backend}-np{world_size}.json")


def write_table(path: str, table: dict[str, Any]) -> None:
    """Write ``table`` to ``path`` (directories made; replaced atomically), one rule a line."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    head = {k: v for k, v in table.items() if k != "rules"}
    lines = [json.dumps(head, indent=2)[:-2] + ',\n  "rules": [']
    rules = table.get("rules", [])
    for i, rule in enumerate(rules):
        lines.append("    " + json.dumps(rule) + ("," if i + 1 < len(rules) else ""))
    lines.append("  ]\n}\n")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write("\n".join(lines))
    os.replace(tmp, path)


def _problems(table: Any) -> list[str]:
    """What makes ``table`` unreadable as a table (empty when it is fine)."""
    if not isinstance(table, dict):
        return ["it is not a JSON object"]
    problems = []
    if table.get("format") != FORMAT:
        problems.append(f"format is {table.get('format')!r}, not {FORMAT!r}")
    rules = table.get("rules")
    if not isinstance(rules, list):
        return [*problems, "it has no list of rules"]
    for i, rule in enumerate(rules):
        if not (
            isinstance(rule, dict)
            and isinstance(rule.get("op"), str)
            and isinstance(rule.get("algorithm"), str)
            and isinstance(rule.get("min_bytes", 0), int)
            and isinstance(rule.get("max_bytes"), int)
            and isinstance(rule.get("params", {}), dict)
        ):
            problems.append(
                f"rule {i} needs op, algorithm (strings), max_bytes (an integer), optional "
                f"min_bytes and params; it is {rule!r}"
            )
    return problems


def load_table(path: str) -> tuple[dict[str, Any] | None, str, str]:
    """``(table, digest of its bytes, "")``, or ``(None, "", why not)``; a missing file
    gives ``(None, "", "")``."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None, "", ""
    except OSError as exc:
        return None, "", f"cannot read it ({exc})"
    try:
        table = json.loads(raw)
    except ValueError as exc:
        return None, "", f"it is not valid JSON ({exc})"
    problems = _problems(table)
    if problems:
        return None, "", "; ".join(problems)
    return table, hashlib.sha256(raw).hexdigest()[:16], ""


class TableTuner(Tuner):
    """The built-in tuner ``table``: answers from ``torchcomms tune``'s table for this
    host, backend and world size; without one it answers ``None`` (the default rules)."""

    def __init__(self, context: TunerContext) -> None:
        super().__init__(context)
        self.path = table_path(context.backend, context.world_size)
        self.digest = "none"
        self.rules: list[dict[str, Any]] = []
        table, digest, why = load_table(self.path)
        if table is None and why:
            report_once(
                ("table", self.path, "bad"),
                f"tuning table {self.path} is ignored: {why}; the default rules decide. Fix "
                f"it by hand or write it again with `torchcomms tune --backend "
                f"{context.backend} --nproc {context.world_size}`",
            )
            return
        if table is None:
            return
        expected = {
            "host": context.host,
            "backend": context.backend,
            "version": context.backend_version,
            "world_size": context.world_size,
        }
        stale = [
            f"{k} {table.get(k)!r} (here {v!r})" for k, v in expected.items() if table.get(k) != v
        ]
        if stale:
            report_once(
                ("table", self.path, "stale"),
                f"tuning table {self.path} was written for another "
                + ", ".join(stale)
                + f"; it is ignored and the default rules decide. Measure this machine with "
                f"`torchcomms tune --backend {context.backend} --nproc {context.world_size}`",
            )
            return
        self.rules = list(table["rules"])
        self.digest = digest
        #: The ranks per host it was measured with (checked per query: counted at creation).
        self.ranks_per_host = table.get("ranks_per_host")

    def choose(self, query: Query) -> Choice | None:
        """The first rule of the query's operation whose size range holds its bucket."""
        if self.ranks_per_host is not None and query.ranks_per_host != self.ranks_per_host:
            # The same on every rank of a host, and a table serves one host only.
            report_once(
                ("table", self.path, "per host"),
                f"tuning table {self.path} was written for ranks_per_host "
                f"{self.ranks_per_host} (here {query.ranks_per_host}); it is ignored and the "
                f"default rules decide. Measure this layout with `torchcomms tune`",
            )
            return None
        for rule in self.rules:
            if (
                rule["op"] == query.op
                and rule.get("min_bytes", 0) <= query.nbytes <= rule["max_bytes"]
            ):
                return Choice(rule["algorithm"], rule.get("params", {}))
        return None

    def fingerprint(self) -> str:
        """The table's digest (``none`` without a usable table)."""
        return f"table:{self.digest}"

"""Write the communicator's operation methods and ``OpName`` from the operation table.

``src/torchcomms_core/operations/table.py`` is the one list of operations. This script
writes the code that follows from it, so that nothing else spells the list out:

- ``src/torchcomms_core/comm/face.py``: ``Face``, the base of ``TorchComm`` with one
  method for each row that names a ``form``: the signature from the row's parameters, its
  docstring, the lean opening where the row says ``lean``, then the one route every call
  takes (guard, the row's form from ``comm.forms``, issue to the backend entry it names,
  ``self._backend.<name>``, so that a reader and a static call graph follow the call into
  the spec method ``TorchCommBackend.<name>`` and its implementations);
- ``src/torchcomms_core/operations/names.py``: ``OpName``, numbered as the reference.

    python scripts/gen_face.py          # rewrite both files
    python scripts/gen_face.py --check  # exit 1 if either is out of date

tests/docs/test_generated_face.py runs the check.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
FACE = ROOT / "src" / "torchcomms_core" / "comm" / "face.py"
NAMES = ROOT / "src" / "torchcomms_core" / "operations" / "names.py"
HEADER = "# Generated from operations/table.py by scripts/gen_face.py: do not edit, rerun it.\n"
WIDTH = 100


def _table() -> ModuleType:
    """``operations/table.py`` loaded on its own (the package imports what it generates)."""
    path = ROOT / "src" / "torchcomms_core" / "operations" / "table.py"
    spec = importlib.util.spec_from_file_location("_operation_table", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _types() -> dict[str, str]:
    t = _table()

    return {
        t.TENSOR: "torch.Tensor",
        t.TENSORS: "list[torch.Tensor]",
        t.INT: "int",
        t.INTS: "Sequence[int]",
        t.REDUCE_OP: "ReduceOp",
    }


def _docstring(doc: str, indent: str) -> list[str]:
    paragraphs = doc.split("\n\n")
    first = f'{indent}"""{paragraphs[0]}'
    if len(paragraphs) == 1:
        line = first + '"""'
        if len(line) > WIDTH:
            raise SystemExit(f"docstring too long for one line: {doc!r}")
        return [line]
    lines = [first]
    for para in paragraphs[1:]:
        lines.append("")
        lines += textwrap.wrap(para, WIDTH, initial_indent=indent, subsequent_indent=indent)
    lines.append(f'{indent}"""')
    return lines


def _method(op: object) -> list[str]:
    name, params = op.name, op.params  # type: ignore[attr-defined]
    types = _types()
    args = ", ".join(p.name for p in params)
    lines = [f"    def {name}(", "        self,"]
    lines += [f"        {p.name}: {types[p.kind]}," for p in params]
    lines += [
        "        async_op: bool = False,",
        "        hints: dict[str, str] | None = None,",
        "        timeout: timedelta | None = None,",
        "    ) -> TorchWork:",
    ]
    lines += _docstring(op.doc, "        ")  # type: ignore[attr-defined]
    if op.lean:  # type: ignore[attr-defined]
        lines += [
            "        lane = self._lane",
            "        if lane is not None and not async_op and timeout is None and hints is None:",
            f"            work = lane.{name}({args})",
            "            if work is not None:",
            "                return work",
        ]
    sep = ", " if args else ""
    lines += [
        f'        call = self._guard("{name}", timeout, hints)',
        f"        bargs, values = forms.{op.form}(self, call{sep}{args})",  # type: ignore[attr-defined]
        f"        return self._issue(call, bargs, async_op, values, self._backend.{name})",
    ]
    return lines


def face() -> str:
    """The text of ``comm/face.py``."""
    OPS = _table().OPS

    head = '''"""``Face``: the communicator's operations, one method per row of the operation table.

Each method takes the row's parameters, then ``async_op``, ``hints`` and ``timeout``, and
returns a ``TorchWork``. A plain synchronous call of a row marked ``lean`` is first offered
to the lean lane (``comm.lean``), which a communicator without hooks or call checking
builds once per change of state; every other call takes the one route: ``_guard`` (state,
timeout, hints), the row's form in ``comm.forms`` (checks and staging), then ``_issue``
(hooks, the call of the backend entry the method names, the work). ``TorchComm``
(``comm.operations``) derives from ``Face`` and adds what is not an operation of the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch

from torchcomms_core.comm import forms
from torchcomms_core.comm.base import CommBase
from torchcomms_core.foundation.work import TorchWork
from torchcomms_core.operations.reduce_op import ReduceOp

__all__ = ["Face"]


class Face(CommBase):
    """The operations of the operation table (``operations.table.OPS``) as methods."""
'''
    body: list[str] = []
    for op in OPS:
        if op.form:
            body.append("")
            body += _method(op)
    return HEADER + head + "\n".join(body) + "\n"


def names() -> str:
    """The text of ``operations/names.py``."""
    OPS = _table().OPS

    head = '''"""``OpName``: the operations a communicator runs, numbered as the reference does."""

from __future__ import annotations

import enum

__all__ = ["OpName"]


class OpName(enum.IntEnum):
    """Operations a communicator runs; values are the reference's.

    Written from the operation table (``operations.table.OPS``), so type checkers see the
    members.
    """
'''
    body: list[str] = []
    for op in OPS:
        what = f"The ``{op.name}`` operation (``{op.where}``)." if op.form else f"``{op.where}``."
        body += [f"    #: {what}", f"    {op.name} = {op.number}"]
    tail = ["", "    def __str__(self) -> str:", "        return self.name", ""]
    return HEADER + head + "\n".join(body) + "\n" + "\n".join(tail)


def _formatted(path: Path, text: str) -> str:
    """``text`` as ``ruff format`` writes it (the project's formatter, in the dev tools)."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(path), "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"ruff format failed on the text for {path}: {done.stderr}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated files, or with ``--check`` report whether they are current."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    opts = parser.parse_args(argv)
    stale = []
    for path, text in ((FACE, face()), (NAMES, names())):
        text = _formatted(path, text)
        current = path.read_text() if path.exists() else ""
        if current == text:
            continue
        if opts.check:
            stale.append(path)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    for path in stale:
        print(f"{path.relative_to(ROOT)} is out of date: run python scripts/gen_face.py")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

"""List private reaches: code that uses another package's underscore names.

A package is a direct subfolder of ``src/torchcomms_core`` (``torchcomms_core.comm``,
``torchcomms_core.c10d``, ...), the modules at the top of ``torchcomms_core`` together,
the face ``torchcomms``, or one plugin's import package. Two kinds of reach are reported,
each as ``file:line: what``:

* an import of an underscore name (``from torchcomms_core.x import _name``, a module
  path with an underscore part, ``import torchcomms_core.x._mod``) or an attribute
  ``module._name`` read through a module of another package;
* a read of one of the communicator's own underscore attributes outside
  ``src/torchcomms_core/comm/``: every ``self._name`` assigned in a class of
  ``src/torchcomms_core/comm/*.py`` is one, and so is each underscore method, class
  attribute or slot of those classes. A read (``x._name``, ``getattr(x, "_name")``,
  ``hasattr(x, "_name")``) of such a name outside ``comm/`` counts, except on ``self``
  or ``cls`` (a class's own attributes). Where a class outside ``comm/`` defines the
  same name (``_lock``, ``_timeout``), only a read through an object whose name says
  communicator (``comm``, ``self._comm``, ``new_comm``) counts.

Dunder names (``__all__``, ``__name__``) are not private. A star import takes what the
module's ``__all__`` declares, its owner's choice, and is not a reach. Modules outside the
project (``torch._C``) are not checked: this is about the project's own boundaries.

    python scripts/private_reaches.py [--root ROOT] [PATH ...]

PATH is a folder or file relative to ROOT (default: ``src``); ``plugins`` checks the
plugins. Prints every reach and the count; exits 1 when there is any.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from import_circles import modules  # the same module walk (scripts/)

#: The folder whose classes are the communicator, relative to the root.
COMM_DIR = os.path.join("src", "torchcomms_core", "comm")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def package_of(dotted: str, known: dict[str, str]) -> str:
    """The package a module belongs to (see the module docstring)."""
    parts = dotted.split(".")
    if parts[0] == "torchcomms_core" and len(parts) > 1:
        sub = f"torchcomms_core.{parts[1]}"
        if known.get(sub, "").endswith("__init__.py"):
            return sub
    return parts[0]


def class_attributes(path: str) -> set[str]:
    """Every underscore attribute the classes of one file define: assigned on ``self``, a
    method, a class attribute or a ``__slots__`` entry."""
    names: set[str] = set()
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for member in cls.body:
            if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(member.name)
            elif isinstance(member, ast.Assign):
                for t in member.targets:
                    if isinstance(t, ast.Name):
                        names.add(t.id)
                        if t.id == "__slots__":
                            names.update(
                                c.value
                                for c in ast.walk(member.value)
                                if isinstance(c, ast.Constant) and isinstance(c.value, str)
                            )
            elif isinstance(member, ast.AnnAssign) and isinstance(member.target, ast.Name):
                names.add(member.target.id)
        for node in ast.walk(cls):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if (
                        isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                    ):
                        names.add(t.attr)
    return {n for n in names if _private(n)}


def comm_attributes(root: str, known: dict[str, str]) -> tuple[set[str], set[str]]:
    """The communicator's underscore attributes, split in two: those no class outside
    ``comm/`` defines (any read elsewhere is a reach) and those some other class defines
    too (a read is a reach when the object read looks like a communicator)."""
    folder = os.path.abspath(os.path.join(root, COMM_DIR))
    ours: set[str] = set()
    elsewhere: set[str] = set()
    for path in sorted(set(known.values())):
        inside = os.path.dirname(os.path.abspath(path)) == folder
        (ours if inside else elsewhere).update(class_attributes(path))
    return ours - elsewhere, ours & elsewhere


def _looks_like_comm(node: ast.expr) -> bool:
    """Whether an expression names a communicator: ``comm``, ``self._comm``, ``new_comm``."""
    if isinstance(node, ast.Name):
        name = node.id
    elif isinstance(node, ast.Attribute):
        name = node.attr
    else:
        return False
    return "comm" in name.lower()


@dataclass(frozen=True)
class Reach:
    """One private reach: where it is and what it reads."""

    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


class _Visitor(ast.NodeVisitor):
    def __init__(
        self, module: str, path: str, known: dict[str, str], attrs: tuple[set[str], set[str]]
    ) -> None:
        self.module = module
        self.is_package = path.endswith("__init__.py")
        self.package = package_of(module, known)
        self.known = known
        self.only_comm, self.shared = attrs
        self.in_comm = module == "torchcomms_core.comm" or module.startswith(
            "torchcomms_core.comm."
        )
        self.bound: dict[str, str] = {}  # local name -> project module it names
        self.found: list[tuple[int, str]] = []

    def _foreign(self, dotted: str) -> bool:
        return dotted in self.known and package_of(dotted, self.known) != self.package

    def _private_part(self, dotted: str) -> bool:
        return any(_private(p) for p in dotted.split(".")[1:])

    def _base(self, node: ast.ImportFrom) -> str:
        base = node.module or ""
        if node.level:
            package = self.module if self.is_package else self.module.rpartition(".")[0]
            parts = package.split(".")
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        return base

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            target = alias.name
            while target and target not in self.known:
                target = target.rpartition(".")[0]
            if target and self._foreign(target) and self._private_part(alias.name):
                self.found.append((node.lineno, f"import {alias.name}"))
            if alias.asname and alias.name in self.known:
                self.bound[alias.asname] = alias.name
            elif not alias.asname:
                head = alias.name.split(".")[0]
                if head in self.known:
                    self.bound[head] = head

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self._base(node)
        for alias in node.names:
            full = f"{base}.{alias.name}"
            module = full if full in self.known else base
            if self._foreign(module) and self._private_part(full):
                self.found.append((node.lineno, f"from {base} import {alias.name}"))
            if full in self.known:
                self.bound[alias.asname or alias.name] = full

    def _module_of(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return self.bound.get(node.id)
        if isinstance(node, ast.Attribute):
            inner = self._module_of(node.value)
            if inner is not None and f"{inner}.{node.attr}" in self.known:
                return f"{inner}.{node.attr}"
        return None

    def _check(self, line: int, value: ast.expr, attr: str, read: bool, text: str) -> None:
        if not _private(attr):
            return
        module = self._module_of(value)
        if module is not None and self._foreign(module):
            self.found.append((line, f"{module}.{attr}"))
        elif (
            module is None
            and read
            and not self.in_comm
            and not (isinstance(value, ast.Name) and value.id in ("self", "cls"))
            and (attr in self.only_comm or (attr in self.shared and _looks_like_comm(value)))
        ):
            self.found.append((line, f"{text} (communicator attribute)"))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        read = isinstance(node.ctx, ast.Load)
        self._check(node.lineno, node.value, node.attr, read, ast.unparse(node))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        # getattr(x, "_name"), hasattr(x, "_name"): the same read, spelled as a call.
        if (
            isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            text = ast.unparse(node)
            self._check(node.lineno, node.args[0], node.args[1].value, True, text)
        self.generic_visit(node)


def _files(root: str, paths: list[str]) -> Iterator[str]:
    for rel in paths:
        path = os.path.join(root, rel)
        if os.path.isfile(path):
            yield path
            continue
        for dirpath, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
            yield from (os.path.join(dirpath, f) for f in sorted(files) if f.endswith(".py"))


def reaches(root: str, paths: list[str]) -> list[Reach]:
    """Every private reach in the modules below ``paths`` (relative to ``root``)."""
    known = modules(root)
    by_path = {os.path.abspath(p): m for m, p in known.items()}
    attrs = comm_attributes(root, known)
    found: list[Reach] = []
    for path in _files(root, paths):
        module = by_path.get(os.path.abspath(path))
        if module is None:  # not inside a package (a script, a test): nothing to cross
            continue
        visitor = _Visitor(module, path, known, attrs)
        visitor.visit(ast.parse(open(path, encoding="utf-8").read(), path))
        rel = os.path.relpath(path, root)
        found += [Reach(rel, line, what) for line, what in sorted(visitor.found)]
    return found


def main() -> int:
    """Print every reach and the count; exit 1 when there is any."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--root", default=here, help="the repository (default: this one)")
    parser.add_argument("paths", nargs="*", default=["src"])
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    missing = [p for p in args.paths if not os.path.exists(os.path.join(root, p))]
    if missing:
        print(
            f"private_reaches.py: no such path under {root}: {', '.join(missing)};"
            " give folders or files relative to --root",
            file=sys.stderr,
        )
        return 2
    found = reaches(root, args.paths)
    for reach in found:
        print(reach)
    print(f"{len(found)} private reaches in {', '.join(args.paths)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

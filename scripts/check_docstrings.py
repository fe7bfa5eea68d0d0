"""Check that every public name of torchcomms, the spec and the plugin namespace has a docstring.

Walks the ``__all__`` of the public namespaces (``NAMESPACES``) and, for every public class,
its public methods, properties and class-level constants, including those it inherits from
project classes (members inherited from outside the project, ``object``'s or ``enum``'s,
are not ours to document). Functions, classes and properties need a docstring; module
constants and class-level constants need a ``#:`` comment above the assignment or a string
right after it (the forms Sphinx autodoc reads). Prints each missing name as
``namespace.name  (defining file:line)`` and a count; exits 1 when anything is missing.

Usage: ``python scripts/check_docstrings.py [--quiet]``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import functools
import importlib
import inspect
import sys
import types
from collections.abc import Iterator
from pathlib import Path

#: The namespaces whose ``__all__`` is public API, in the order they are reported.
NAMESPACES = (
    "torchcomms",
    "torchcomms.hooks",
    "torchcomms.objcol",
    "torchcomms.functional",
    "torchcomms.device_mesh",
    "torchcomms.distwrap",
    "torchcomms.elastic",
    "torchcomms_core.spec",
    "torchcomms_core.plugin",
)

#: Top-level packages whose code is ours; members defined anywhere else are inherited.
PROJECT_PACKAGES = ("torchcomms", "torchcomms_core")


def _is_project(module_name: str | None) -> bool:
    top = (module_name or "").split(".", 1)[0]
    return top in PROJECT_PACKAGES or top.startswith("torchcomms_")


@functools.cache
def _attr_docs(path: str) -> dict[tuple[str, str], int]:
    """Map (class qualname or '', attribute) to the line of each documented assignment."""
    source = Path(path).read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    found: dict[tuple[str, str], int] = {}

    def targets(node: ast.stmt) -> list[str]:
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        return []

    def self_targets(node: ast.stmt) -> list[str]:
        nodes = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            nodes = [node.target]
        return [
            t.attr
            for t in nodes
            if isinstance(t, ast.Attribute)
            and isinstance(t.value, ast.Name)
            and t.value.id == "self"
        ]

    def walk(body: list[ast.stmt], scope: str, in_method: bool = False) -> None:
        for index, node in enumerate(body):
            if isinstance(node, ast.ClassDef):
                walk(node.body, f"{scope}.{node.name}" if scope else node.name)
                continue
            if isinstance(node, ast.FunctionDef) and scope and not in_method:
                # `self.name = ...` in a method documents an instance attribute (a slot).
                walk(node.body, scope, in_method=True)
                continue
            if in_method:
                if isinstance(node, ast.If | ast.With | ast.Try):
                    walk(node.body, scope, in_method=True)
                    continue
                names = self_targets(node)
            else:
                names = targets(node)
            if not names:
                continue
            # A `#:` comment block right above (decorators do not apply to assignments).
            above = node.lineno - 2
            commented = above >= 0 and lines[above].strip().startswith("#:")
            # Or a bare string right after the assignment.
            after = body[index + 1] if index + 1 < len(body) else None
            string_after = (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            )
            # Or a trailing `#: ...` on the assignment's own line.
            trailing = "#:" in lines[node.lineno - 1]
            if commented or string_after or trailing:
                for name in names:
                    found[(scope, name)] = node.lineno

    walk(tree.body, "")
    return found


@functools.cache
def _imports(module_name: str) -> dict[str, tuple[str, str]]:
    """Map each name a module imports with ``from X import name`` to (X, original name)."""
    module = sys.modules[module_name]
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return {}
    tree = ast.parse(Path(path).read_text())
    package = module_name if path.endswith("__init__.py") else module_name.rpartition(".")[0]
    result: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                result[alias.asname or alias.name] = (base, alias.name)
    return result


def _data_location(module_name: str, name: str, depth: int = 0) -> tuple[str, int] | None:
    """Where a module-level constant reachable from ``module_name`` is documented, if it is."""
    if depth > 10:
        return None
    module = importlib.import_module(module_name)
    path = getattr(module, "__file__", None)
    if path and path.endswith(".py"):
        line = _attr_docs(path).get(("", name))
        if line is not None:
            return path, line
    imported = _imports(module_name).get(name)
    if imported is not None:
        return _data_location(imported[0], imported[1], depth + 1)
    star = _imports(module_name).get("*")
    if star is not None:
        return _data_location(star[0], name, depth + 1)
    return None


def _own_doc(obj: object) -> str | None:
    """The docstring a reader sees, excluding ones Python or dataclasses make up."""
    if isinstance(obj, type):
        doc = obj.__dict__.get("__doc__")
        if not doc:
            return None
        if dataclasses.is_dataclass(obj):
            try:
                generated = obj.__name__ + str(inspect.signature(obj)).replace(" -> None", "")
            except (TypeError, ValueError):
                generated = None
            if doc == generated:
                return None
        if issubclass(obj, enum.Enum) and doc == "An enumeration.":
            return None
        return str(doc)
    return inspect.getdoc(obj)


def _location(obj: object) -> str:
    try:
        target = inspect.unwrap(obj) if callable(obj) else obj
        if isinstance(target, property) and target.fget is not None:
            target = target.fget
        path = inspect.getsourcefile(target)  # type: ignore[arg-type]
        _, line = inspect.getsourcelines(target)  # type: ignore[arg-type]
    except (TypeError, OSError):
        # Classes built at import time have no source of their own: name their module.
        module = sys.modules.get(getattr(obj, "__module__", "") or "")
        return _short(getattr(module, "__file__", None))
    return f"{_short(path)}:{line}"


def _short(path: str | None) -> str:
    if not path:
        return "?"
    root = Path(__file__).resolve().parent.parent
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return path


def _is_routine(value: object) -> bool:
    return isinstance(
        value,
        types.FunctionType | classmethod | staticmethod | functools.partialmethod,
    ) or inspect.isroutine(value)


def _class_members(cls: type) -> Iterator[tuple[str, type, object]]:
    """(name, defining class, raw attribute) of each public member ``cls`` resolves to."""
    seen: set[str] = set()
    for base in inspect.getmro(cls):
        for name, value in vars(base).items():
            if name in seen:
                continue
            seen.add(name)
            if name.startswith("_") or not _is_project(base.__module__):
                continue
            if isinstance(base, enum.EnumMeta) and name in getattr(base, "__members__", {}):
                # Enum members are documented by the enum's docstring table or `#:` lines.
                yield name, base, value
                continue
            yield name, base, value


def _member_missing(cls: type, name: str, owner: type, value: object) -> str | None:
    """None when documented; else the location to report."""
    if isinstance(value, property | functools.cached_property):
        return None if inspect.getdoc(value) else _location(value)
    if isinstance(value, classmethod | staticmethod):
        value = value.__func__
    if _is_routine(value) or isinstance(value, type):
        # Overrides without their own docstring show the documentation they override.
        doc = inspect.getdoc(getattr(cls, name, value))
        return None if doc else _location(value)
    if isinstance(value, types.MemberDescriptorType | types.GetSetDescriptorType):
        # A slot: a `__slots__` dict's text, or a `#:` comment on `self.name = ...`.
        if getattr(value, "__doc__", None):
            return None
        if owner is not cls:
            cls = owner
    # A class-level constant (an enum member, a ClassVar, a dataclass field default), or
    # a slot without text. Like a method override, an override of a constant shows the
    # `#:` comment of the project class it overrides (autodoc reads them the same way).
    for base in inspect.getmro(cls):
        if not _is_project(base.__module__) or name not in vars(base):
            continue
        path = getattr(sys.modules.get(base.__module__), "__file__", None)
        if path and path.endswith(".py") and (base.__qualname__, name) in _attr_docs(path):
            return None
    return _short(getattr(sys.modules.get(owner.__module__), "__file__", None))


def _public_names(module: types.ModuleType) -> list[str]:
    """``__all__``, or (for a module without one) the public names it defines itself."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    tree = ast.parse(Path(str(module.__file__)).read_text())
    defined: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.append(node.name)
        elif isinstance(node, ast.Assign):
            defined.extend(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.append(node.target.id)
    return [name for name in dict.fromkeys(defined) if not name.startswith("_")]


def check(namespaces: tuple[str, ...] = NAMESPACES) -> list[str]:
    """Every undocumented public name of ``namespaces``, as ``namespace.name  (location)``."""
    missing: list[str] = []
    reported: set[int] = set()
    reported_members: set[tuple[int, str]] = set()
    for namespace in namespaces:
        module = importlib.import_module(namespace)
        if not inspect.getdoc(module):
            missing.append(f"{namespace}  (module docstring)")
        for name in _public_names(module):
            if name.startswith("_"):
                continue
            value = getattr(module, name)
            if not inspect.ismodule(value) and not _is_project(getattr(value, "__module__", "")):
                if _is_routine(value) or isinstance(value, type):
                    continue  # a re-export of torch's or the standard library's own name
            qualified = f"{namespace}.{name}"
            if inspect.ismodule(value) or _is_routine(value) or isinstance(value, type):
                if id(value) not in reported and not _own_doc(value):
                    missing.append(f"{qualified}  ({_location(value)})")
                reported.add(id(value))
            else:
                if (id(value), name) not in reported_members:
                    location = _data_location(namespace, name)
                    if location is None:
                        where = _short(getattr(sys.modules.get(namespace), "__file__", None))
                        missing.append(f"{qualified}  (a constant imported into {where})")
                reported_members.add((id(value), name))
                continue
            if isinstance(value, type):
                for member, owner, raw in _class_members(value):
                    key = (id(owner), member)
                    if key in reported_members:
                        continue
                    reported_members.add(key)
                    found = _member_missing(value, member, owner, raw)
                    if found is not None:
                        missing.append(f"{qualified}.{member}  ({found})")
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quiet", action="store_true", help="print the count only")
    args = parser.parse_args(argv)
    missing = check()
    if not args.quiet:
        for line in missing:
            print(line)
    if missing:
        print(f"check_docstrings: {len(missing)} public names have no docstring", file=sys.stderr)
        return 1
    print("check_docstrings: every public name has a docstring")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""List import circles between modules of the core and the plugins.

A circle is two or more modules that import one another, directly or through others, at
module level, inside functions or under ``TYPE_CHECKING``: every ``import`` statement
counts. A package and its own submodules are not a circle (a package's ``__init__`` may
re-export what its submodules define). import-linter's layer contracts keep the packages
in order; this keeps the modules inside them in order too.

    python scripts/import_circles.py [ROOT]     # exit status 1 when a circle is found
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections.abc import Iterator


def source_roots(root: str) -> list[str]:
    """The folders holding import packages: ``src`` and every ``plugins/*/src``."""
    roots = [os.path.join(root, "src")]
    plugins = os.path.join(root, "plugins")
    if os.path.isdir(plugins):
        roots += [os.path.join(plugins, p, "src") for p in sorted(os.listdir(plugins))]
    return [r for r in roots if os.path.isdir(r)]


def modules(root: str) -> dict[str, str]:
    """Every module below the source roots: dotted name to file."""
    found: dict[str, str] = {}
    for src in source_roots(root):
        for dirpath, _, files in os.walk(src):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    dotted = os.path.relpath(path, src)[:-3].replace(os.sep, ".")
                    found[dotted.removesuffix(".__init__")] = path
    return found


def _imported(module: str, path: str, known: dict[str, str]) -> Iterator[str]:
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t if t in known else base for t in targets]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module:
                yield target


def _related(a: str, b: str) -> bool:
    return a.startswith(b + ".") or b.startswith(a + ".")


def circles(root: str) -> list[list[str]]:
    """Each group of modules that import one another (strongly connected, two or more)."""
    known = modules(root)
    edges = {m: {t for t in _imported(m, p, known) if not _related(m, t)} for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(known) + 100))
    for v in sorted(known):
        if v not in index:
            visit(v)
    return sorted(groups)


def main() -> int:
    """Print every circle; exit 1 when there is one."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default=os.path.dirname(os.path.dirname(__file__)))
    found = circles(os.path.abspath(parser.parse_args().root))
    for group in found:
        print("import circle:", " <-> ".join(group))
    print(f"{len(found)} import circles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

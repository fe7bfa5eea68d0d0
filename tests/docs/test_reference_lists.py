"""The API reference lists every public name of the namespaces it lists by hand.

``docs/reference/plugin.rst`` names ``torchcomms_core.plugin``'s exports one by one: those
it shares with the face and the spec as links to where they are documented, its own in
the ``automodule`` ``:members:`` option (classes and functions: autodoc leaves out a
constant it cannot find a comment for in that module), its constants as ``autodata`` of
the modules that define them, and the lazily imported ``bench`` module. A name added to
``__all__`` and not to the page would be missing from the reference without a warning.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"

_LINK = re.compile(r":py:(?:obj|mod):`(\w+) <([\w.]+)>`")
_AUTODATA = re.compile(r"^\.\. autodata:: ([\w.]+)$", re.M)


def _resolve(dotted: str) -> Any:
    """The object a dotted path names: ``pkg.module`` or ``pkg.module.attribute``."""
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError:
        module, _, attr = dotted.rpartition(".")
        return getattr(importlib.import_module(module), attr)


def _members(text: str, module: str) -> list[str]:
    found = re.search(rf"^\.\. automodule:: {re.escape(module)}\n((?:   :.*\n)+)", text, re.M)
    assert found, f"no automodule of {module}"
    option = re.search(r"^   :members: (.*)$", found.group(1), re.M)
    assert option, f"the automodule of {module} lists no :members:"
    return [name.strip() for name in option.group(1).split(",")]


def _documented_modules() -> set[str]:
    """The modules the reference renders with ``automodule``."""
    text = "".join(p.read_text() for p in REFERENCE.glob("*.rst"))
    return set(re.findall(r"^\.\. automodule:: ([\w.]+)$", text, re.M))


def test_the_plugin_page_lists_every_name_of_the_plugin_namespace_once() -> None:
    import torchcomms_core.plugin as plugin

    text = (REFERENCE / "plugin.rst").read_text()
    links = _LINK.findall(text)
    own = _members(text, "torchcomms_core.plugin")
    constants = _AUTODATA.findall(text)
    listed = [name for name, _ in links] + own + [c.rpartition(".")[2] for c in constants]
    duplicated = sorted({n for n in listed if listed.count(n) > 1})
    assert not duplicated, f"listed more than once in plugin.rst: {duplicated}"
    missing = sorted(set(plugin.__all__) - set(listed))
    assert not missing, (
        f"torchcomms_core.plugin exports {missing}, which docs/reference/plugin.rst does not "
        f"list; add each to the links (documented in the face or the spec), the automodule's "
        f":members: (classes and functions) or an autodata (constants)"
    )
    extra = sorted(set(listed) - set(plugin.__all__))
    assert not extra, f"plugin.rst lists {extra}, which torchcomms_core.plugin does not export"


def test_every_entry_of_the_plugin_page_is_the_object_the_namespace_exports() -> None:
    import torchcomms_core.plugin as plugin

    text = (REFERENCE / "plugin.rst").read_text()
    rendered = _documented_modules()
    for name, target in _LINK.findall(text):
        assert _resolve(target) is getattr(plugin, name), f"{name} links to {target}"
        home = target if inspect.ismodule(_resolve(target)) else target.rpartition(".")[0]
        assert home in rendered, f"{name} links to {target}, but no page renders {home}"
    for dotted in _AUTODATA.findall(text):
        name = dotted.rpartition(".")[2]
        assert _resolve(dotted) is getattr(plugin, name), f"autodata {dotted}"
    for name in _members(text, "torchcomms_core.plugin"):
        value = getattr(plugin, name)
        assert inspect.isclass(value) or inspect.isfunction(value), (
            f"{name} in the automodule's :members: is neither a class nor a function: "
            f"autodoc would leave it out; document it with autodata where it is defined"
        )

"""scripts/check_docstrings.py reports exactly the public names that lack a docstring.

A small namespace written to a temporary folder has one documented and one undocumented
name of every kind the rule covers: function, class, method, property, module constant,
class constant, enum member and slot attribute; members inherited from the standard
library are not reported.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]

FIXTURE = '''
"""A namespace with documented and undocumented names."""

import enum

__all__ = [
    "documented", "undocumented", "Good", "Bare", "Color", "LIMIT", "NO_DOC", "Slots",
]

#: How many.
LIMIT = 3
NO_DOC = 4


def documented() -> None:
    """Do a thing."""


def undocumented() -> None:
    pass


class Good:
    """A documented class."""

    #: A documented constant.
    SIZE = 1
    BARE_CONSTANT = 2

    def method(self) -> None:
        """Documented."""

    def bare_method(self) -> None:
        pass

    @property
    def prop(self) -> int:
        """Documented."""
        return 1

    @property
    def bare_prop(self) -> int:
        return 1


class Bare(Good):
    def method(self) -> None:  # an override: shows Good.method's docstring
        pass


class Color(enum.Enum):
    """Colours."""

    #: Documented.
    RED = 1
    BLUE = 2


class Slots:
    """Slots."""

    __slots__ = ("kept", "lost")

    def __init__(self) -> None:
        #: Documented.
        self.kept = 1
        self.lost = 2
'''


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def checker(tmp_path: Path) -> Iterator[ModuleType]:
    # The fixture's top-level name starts with "torchcomms_": the rule counts it as ours.
    (tmp_path / "torchcomms_docfixture.py").write_text(textwrap.dedent(FIXTURE))
    _load(tmp_path / "torchcomms_docfixture.py", "torchcomms_docfixture")
    try:
        yield _load(ROOT / "scripts" / "check_docstrings.py", "check_docstrings")
    finally:
        sys.modules.pop("torchcomms_docfixture", None)
        sys.modules.pop("check_docstrings", None)


def test_reports_each_undocumented_name_and_nothing_else(checker: ModuleType) -> None:
    missing = {line.split()[0] for line in checker.check(("torchcomms_docfixture",))}
    assert missing == {
        "torchcomms_docfixture.undocumented",
        "torchcomms_docfixture.NO_DOC",
        "torchcomms_docfixture.Bare",
        "torchcomms_docfixture.Good.BARE_CONSTANT",
        "torchcomms_docfixture.Good.bare_method",
        "torchcomms_docfixture.Good.bare_prop",
        "torchcomms_docfixture.Color.BLUE",
        "torchcomms_docfixture.Slots.lost",
    }


def test_exits_non_zero_and_prints_the_count(
    checker: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(checker, "NAMESPACES", ("torchcomms_docfixture",))
    monkeypatch.setattr(checker.check, "__defaults__", (("torchcomms_docfixture",),))
    assert checker.main([]) == 1
    captured = capsys.readouterr()
    assert "torchcomms_docfixture.Color.BLUE" in captured.out
    assert "8 public names have no docstring" in captured.err

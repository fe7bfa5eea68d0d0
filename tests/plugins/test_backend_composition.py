"""Backends are built by composition: a plugin's backend class holds its parts.

A backend class may inherit from the core's classes (``TorchCommBackend``, the engine
bases, the kit's helpers) and from at most one class of its own plugin: two classes of
the plugin in its ancestry at most, itself included. The parts (segment, small-message
path, collectives, point-to-point, lean calls) are objects it holds, so a call goes down
into them and never back up through ``self``.
"""

from __future__ import annotations

import importlib

import pytest

from torchcomms_core.plugin_host.backends import available_backends, get_backend_class

# The bundled plugins' distributions: each one's backend must be installed here.
BUNDLED = ("gloo", "shm", "hier", "mpi", "ncclx", "rccl")


def _own_classes(cls: type) -> list[str]:
    package = cls.__module__.split(".")[0]
    return [k.__qualname__ for k in cls.__mro__ if k.__module__.split(".")[0] == package]


@pytest.mark.parametrize("name", BUNDLED)
def test_a_bundled_backend_inherits_at_most_one_class_of_its_plugin(name: str) -> None:
    assert name in available_backends(), f"backend {name!r} is not installed"
    try:
        cls = get_backend_class(name)
    except Exception as exc:  # an accelerator backend may refuse to load without its build
        pytest.skip(f"backend {name!r} does not load here: {exc}")
    own = _own_classes(cls)
    assert len(own) <= 2, f"{cls.__qualname__} inherits through {own}: hold the parts instead"


def test_the_check_sees_a_chain() -> None:
    """The rule counts classes of the plugin's own package, so a chain of three fails it."""
    module = importlib.import_module("torchcomms_core.spec")
    base = module.TorchCommBackend
    chain_a = type("A", (base,), {"__module__": "someplugin.a"})
    chain_b = type("B", (chain_a,), {"__module__": "someplugin.b"})
    chain_c = type("C", (chain_b,), {"__module__": "someplugin.c"})
    assert _own_classes(chain_c) == ["C", "B", "A"]

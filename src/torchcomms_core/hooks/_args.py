"""Reading the tensors and peers out of a hook's argument object, whatever its field names.

Hook argument objects name their fields as Meta's torchcomms does (``input``/``output``,
``peer``, ``num_ops``); earlier versions of this package used the method parameter names
(``tensor_list``, ``input_tensor_list``, ``dst``/``src``). The shipped hooks read both.
"""

from __future__ import annotations

from typing import Any

import torch

#: Operations whose ``tensor`` is both input and output.
IN_PLACE = frozenset({"all_reduce", "broadcast", "reduce"})
_INPUT_NAMES = ("input", "input_list", "input_tensor_list", "input_tensor")
_OUTPUT_NAMES = ("output", "output_tensor_list", "output_tensor")


def fields(args: Any) -> dict[str, Any]:
    """The argument object's fields as a dict (``as_dict()`` where it has one).

    Read it, do not change it: it may be the dict ``as_dict()`` returned (a fresh copy
    for the core's argument objects).
    """
    as_dict = getattr(args, "as_dict", None)
    if callable(as_dict):
        try:
            found = as_dict()
            return found if type(found) is dict else dict(found)
        except Exception:  # a foreign argument object: fall back to attribute reads
            pass
    names = (
        "tensor",
        "tensor_list",
        "peer",
        "dst",
        "src",
        "root",
        "num_ops",
        "ops",
        *_INPUT_NAMES,
        *_OUTPUT_NAMES,
    )
    out: dict[str, Any] = {}
    for name in names:
        try:
            out[name] = getattr(args, name)
        except AttributeError:
            continue
    return out


def _first(f: dict[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        if name in f:
            return f[name]
    return None


def raw_io(op: str, f: dict[str, Any]) -> tuple[Any, Any]:
    """``(input, output)`` of one operation: a tensor, a list of tensors, or ``None``."""
    if "tensor_list" in f and op in ("all_gather", "all_gather_v"):  # earlier names
        return f.get("tensor"), f["tensor_list"]
    if "tensor" in f:
        t = f["tensor"]
        if op == "send":
            return t, None
        if op == "recv":
            return None, t
        return t, t
    # The first names are the common ones (looked up inline: hooks call this per operation).
    inp = f["input"] if "input" in f else _first(f, _INPUT_NAMES)
    out = f["output"] if "output" in f else _first(f, _OUTPUT_NAMES)
    return inp, out


def tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in ``value`` (one tensor, a list of them, or nothing)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


def peer(f: dict[str, Any]) -> Any:
    """The peer of a send or receive (``peer``, or the earlier ``dst``/``src``)."""
    return _first(f, ("peer", "dst", "src"))


def batch_ops(args: Any) -> list[tuple[str, torch.Tensor, int]] | None:
    """``[(kind, tensor, peer), ...]`` of a batch, where the argument object carries them."""
    ops = getattr(args, "ops", None)
    if ops is None:
        return None
    out = []
    for op in ops:
        if isinstance(op, (tuple, list)) and len(op) == 3:
            kind, tensor, where = op
        else:  # a P2POp-like object
            kind = getattr(op, "type", getattr(op, "op", ""))
            tensor, where = getattr(op, "tensor", None), getattr(op, "peer", None)
        kind = str(getattr(kind, "name", kind)).lower()
        out.append(("send" if "send" in kind else "recv", tensor, where))
    return out

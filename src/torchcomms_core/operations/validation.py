"""Argument checks run before any communication, with messages that say what to fix."""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import CommInputError, CommTypeError
from torchcomms_core.operations.reduce_op import RedOpType, ReduceOp, coerce_reduce_op

_STRIDED = torch.strided
_BITWISE = (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR)
_NEEDS_FLOAT = (RedOpType.AVG, RedOpType.PREMUL_SUM)


class Checker:
    """Validates arguments for one communicator (its device, size and dtypes)."""

    __slots__ = (
        "comm_name",
        "device",
        "device_type",
        "device_index",
        "size",
        "rank",
        "dtypes",
        "native_ops",
    )

    def __init__(
        self,
        comm_name: str,
        device: torch.device,
        rank: int,
        size: int,
        dtypes: Sequence[torch.dtype],
        native_ops: frozenset[RedOpType],
    ) -> None:
        self.comm_name = comm_name
        self.device = device
        self.device_type = device.type
        self.device_index = device.index
        self.rank = rank
        self.size = size
        self.dtypes = frozenset(dtypes)
        self.native_ops = native_ops

    # -- tensors ---------------------------------------------------------------------

    def tensor(self, op: str, arg: str, t: Any) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise CommTypeError(f"{op}: {arg} must be a torch.Tensor, got {type(t).__name__}")
        # Cheap checks first: this runs on every call (is_cpu avoids building a device).
        if self.device_type == "cpu":
            on_device = t.is_cpu
        else:
            dev = t.device
            on_device = dev.type == self.device_type and (
                self.device_index is None or dev.index == self.device_index
            )
        if not on_device:
            dev = t.device
            raise CommInputError(
                f"{op}: {arg} is on device {dev}, but communicator {self.comm_name!r} owns "
                f"device {self.device}; move it with .to({str(self.device)!r})"
            )
        if t.dtype not in self.dtypes:
            supported = ", ".join(sorted(str(d).replace("torch.", "") for d in self.dtypes))
            raise CommInputError(
                f"{op}: {arg} has dtype {str(t.dtype).replace('torch.', '')}, which this "
                f"backend does not support (supported: {supported})"
            )
        if t.layout is not _STRIDED:
            raise CommInputError(
                f"{op}: {arg} must be a dense (strided) tensor, got {t.layout}; "
                f"call .to_dense() first"
            )
        if t.is_nested:
            raise CommInputError(
                f"{op}: {arg} is a nested tensor; collectives take one dense tensor: pass "
                f"its components (.unbind()) or a padded copy (.to_padded_tensor(0))"
            )
        if t.is_neg() or t.is_conj():
            # An engine reads and writes memory, which holds such a view's values with the
            # other sign (or conjugated): results would be silently wrong.
            raise CommInputError(
                f"{op}: {arg} is a lazily negated or conjugated view (is_neg() or "
                f"is_conj(), e.g. the .imag of a .conj()), whose memory holds other values "
                f"than it shows; pass t.resolve_neg() or t.resolve_conj() (a copy with the "
                f"values it shows)"
            )
        return t

    def tensor_list(
        self, op: str, arg: str, ts: Any, length: int | None = None
    ) -> list[torch.Tensor]:
        if not isinstance(ts, (list, tuple)):
            raise CommTypeError(f"{op}: {arg} must be a list of tensors, got {type(ts).__name__}")
        if length is not None and len(ts) != length:
            raise CommInputError(
                f"{op}: {arg} has {len(ts)} tensors but must have one per rank "
                f"(communicator size {length})"
            )
        return [self.tensor(op, f"{arg}[{i}]", t) for i, t in enumerate(ts)]

    def same_dtype(
        self, op: str, a_name: str, a: torch.Tensor, b_name: str, b: torch.Tensor
    ) -> None:
        if a.dtype != b.dtype:
            raise CommInputError(
                f"{op}: {a_name} has dtype {str(a.dtype).replace('torch.', '')} but {b_name} "
                f"has dtype {str(b.dtype).replace('torch.', '')}; they must match"
            )

    def numel(self, op: str, arg: str, t: torch.Tensor, expected: int, why: str) -> None:
        if t.numel() != expected:
            raise CommInputError(
                f"{op}: {arg} has {t.numel()} elements (shape {tuple(t.shape)}) but must have "
                f"{expected} ({why})"
            )

    def blocks(
        self,
        op: str,
        arg: str,
        ts: Any,
        ref_arg: str,
        ref: torch.Tensor,
        only: int | None = None,
    ) -> list[torch.Tensor]:
        """One tensor per rank, each of ``ref``'s dtype and element count.

        With ``only`` set, just that entry must match ``ref``'s element count (the ``_v``
        forms, where other ranks' blocks may differ).
        """
        why = f"the same as {ref_arg}" if only is None else f"this rank's own entry, as {ref_arg}"
        checked = self.tensor_list(op, arg, ts, self.size)
        for i, t in enumerate(checked):
            self.same_dtype(op, f"{arg}[{i}]", t, ref_arg, ref)
            if only is None or i == only:
                self.numel(op, f"{arg}[{i}]", t, ref.numel(), why)
        return checked

    def pair(self, op: str, output: Any, input: Any) -> None:  # noqa: A002
        """An ``output`` and an ``input`` tensor of one dtype."""
        self.tensor(op, "output", output)
        self.tensor(op, "input", input)
        self.same_dtype(op, "output", output, "input", input)

    def times_size(self, op: str, arg: str, t: torch.Tensor, of_arg: str, of: torch.Tensor) -> None:
        """``t`` holds one block of ``of``'s size per rank."""
        n = self.size
        self.numel(op, arg, t, of.numel() * n, f"{of_arg}.numel() * size = {of.numel()} * {n}")

    # -- ranks -----------------------------------------------------------------------

    def peer(self, op: str, arg: str, r: Any, allow_self: bool = True) -> int:
        try:
            value = operator.index(r)
        except TypeError:
            raise CommTypeError(f"{op}: {arg} must be an int rank, got {r!r}") from None
        if not 0 <= value < self.size:
            raise CommInputError(
                f"{op}: {arg}={value} is out of range for communicator {self.comm_name!r} of "
                f"size {self.size}; valid ranks are 0..{self.size - 1}"
            )
        if not allow_self and value == self.rank:
            raise CommInputError(
                f"{op}: {arg}={value} is this rank itself; copy the tensor locally instead"
            )
        return value

    def split_ranks(self, ranks: Any) -> list[int]:
        """The members of a ``split``: distinct valid ranks including this one, or none.

        Linear in the number of ranks (a list of 100,000 is checked in well under a second),
        and an error quotes a long list by its length and first entries only.
        """
        if not isinstance(ranks, (list, tuple, range)):
            raise CommTypeError(f"split: ranks must be a list of ints, got {type(ranks).__name__}")
        members = [self.peer("split", f"ranks[{i}]", r) for i, r in enumerate(ranks)]
        if len(set(members)) != len(members):
            dupes = sorted(r for r, n in Counter(members).items() if n > 1)
            raise CommInputError(
                f"split: ranks {_quoted(members)} contain duplicates {_quoted(dupes)}; list "
                f"each rank once"
            )
        if members and self.rank not in members:
            raise CommInputError(
                f"split: ranks {_quoted(members)} do not include this rank ({self.rank}); pass "
                f"the group this rank belongs to, or [] if it joins none"
            )
        return sorted(members)

    # -- reductions ------------------------------------------------------------------

    def reduce_op(self, op_name: str, op: Any, dtype: torch.dtype) -> ReduceOp:
        red = op if type(op) is ReduceOp else coerce_reduce_op(op, f"{op_name}: op")
        t = red._type
        if t is RedOpType.SUM:
            return red
        if t in _BITWISE:
            if dtype.is_floating_point or dtype.is_complex:
                raise CommInputError(
                    f"{op_name}: ReduceOp.{t.name} is bitwise and needs an integer or bool "
                    f"tensor, got {str(dtype).replace('torch.', '')}"
                )
        elif t in _NEEDS_FLOAT and t not in self.native_ops:
            if not dtype.is_floating_point:
                raise CommInputError(
                    f"{op_name}: ReduceOp.{t.name} needs a floating-point tensor, got "
                    f"{str(dtype).replace('torch.', '')}; use SUM and divide yourself"
                )
            factor = red.factor
            if isinstance(factor, torch.Tensor) and factor.device.type != self.device_type:
                raise CommInputError(
                    f"{op_name}: PREMUL_SUM factor is on {factor.device}, communicator "
                    f"{self.comm_name!r} owns {self.device}"
                )
        return red


#: How many entries of a rank list an error message quotes before it abbreviates.
QUOTED_RANKS = 16


def _quoted(ranks: Sequence[int]) -> str:
    """``ranks`` as an error message shows it: whole up to ``QUOTED_RANKS`` entries, else the
    first ones, the last one and the count (a message must not grow with the world)."""
    if len(ranks) <= QUOTED_RANKS:
        return str(list(ranks))
    head = ", ".join(str(r) for r in ranks[: QUOTED_RANKS - 1])
    return f"[{head}, ..., {ranks[-1]}] ({len(ranks)} ranks)"


def lean_pairs(
    dtypes: Sequence[torch.dtype], native: frozenset[RedOpType]
) -> frozenset[tuple[torch.dtype, RedOpType]]:
    """``(dtype, reduction)`` pairs a reduction may pass to the backend without any check
    or lowering: native reductions valid for the dtype (PREMUL_SUM, which carries a
    factor to check, is left to the general path)."""
    pairs = set()
    for dtype in dtypes:
        exact = not (dtype.is_floating_point or dtype.is_complex)
        for t in native:
            if t is RedOpType.PREMUL_SUM or (t in _BITWISE and not exact):
                continue
            if t is RedOpType.AVG and not dtype.is_floating_point:
                continue
            pairs.add((dtype, t))
    return frozenset(pairs)


def split_sizes(op: str, arg: str, sizes: Any, n: int, rows: int) -> list[int]:
    """Check an all_to_all_v split list: ``n`` non-negative ints summing to ``rows``."""
    if not isinstance(sizes, (list, tuple)):
        raise CommTypeError(f"{op}: {arg} must be a list of ints, got {type(sizes).__name__}")
    if len(sizes) == 0:
        if rows % n:
            raise CommInputError(
                f"{op}: {arg} is empty (equal split), so dim 0 ({rows}) must be divisible by "
                f"the communicator size {n}"
            )
        return [rows // n] * n
    if len(sizes) != n:
        raise CommInputError(
            f"{op}: {arg} has {len(sizes)} entries but must have one per rank ({n})"
        )
    out = []
    for i, s in enumerate(sizes):
        try:
            v = operator.index(s)
        except TypeError:
            raise CommTypeError(f"{op}: {arg}[{i}] must be an int, got {s!r}") from None
        if v < 0:
            raise CommInputError(f"{op}: {arg}[{i}]={v} is negative")
        out.append(v)
    if sum(out) != rows:
        raise CommInputError(
            f"{op}: {arg} sums to {sum(out)} but the tensor has {rows} rows along dim 0"
        )
    return out


# -- per-call options -------------------------------------------------------------------


def check_timeout(timeout: Any, where: str) -> timedelta:
    """Accept a positive ``timedelta`` or a number of seconds up to ``MAX_TIMEOUT``.

    The same rule serves ``new_comm``, ``set_timeout``, ``split`` and every operation's
    ``timeout=``, so a value refused here never reaches an engine.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float, timedelta)):
        raise CommTypeError(
            f"{where}: timeout must be a datetime.timedelta or a number of seconds, got {timeout!r}"
        )
    if not isinstance(timeout, timedelta):
        if not math.isfinite(timeout):
            raise CommInputError(
                f"{where}: timeout must be a finite number of seconds, got {timeout!r}"
            )
        if timeout > _env.MAX_TIMEOUT.total_seconds():
            raise _too_long(where, f"{timeout} s")
        timeout = timedelta(seconds=timeout)
    if timeout <= timedelta(0):
        raise CommInputError(
            f"{where}: timeout must be positive, got {timeout}; pass e.g. timedelta(seconds=30)"
        )
    if timeout > _env.MAX_TIMEOUT:
        raise _too_long(where, str(timeout))
    checked: timedelta = timeout
    return checked


def _too_long(where: str, shown: str) -> CommInputError:
    return CommInputError(
        f"{where}: timeout {shown} is longer than the longest supported "
        f"({_env.MAX_TIMEOUT.days} days); engines overflow beyond it. Pass a shorter timeout"
    )


def check_hints(hints: Any, where: str) -> dict[str, str]:
    """Accept a ``dict[str, str]`` of backend hints."""
    if not isinstance(hints, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in hints.items()
    ):
        raise CommTypeError(f"{where}: hints must be a dict[str, str], got {hints!r}")
    return hints


# -- tensors the operation writes into ---------------------------------------------------

_OVERLAP_YES = 1  # at::MemOverlap::Yes


def writable(op: str, t: torch.Tensor) -> None:
    """Refuse a non-contiguous result tensor the core could not copy the result back into.

    Called only for non-contiguous tensors (the core stages those through a contiguous
    copy), so the common contiguous case pays nothing.
    """
    if torch._debug_has_internal_overlap(t) == _OVERLAP_YES:
        raise CommInputError(
            f"{op}: the tensor that receives the result (shape {tuple(t.shape)}, stride "
            f"{tuple(t.stride())}) has elements that share memory, e.g. an expand() or "
            f"broadcast view, so a result cannot be written into it; pass a tensor with its "
            f"own storage, e.g. t.clone() or torch.empty(shape)"
        )
    if t.requires_grad and torch.is_grad_enabled():
        base = t._base if t._base is not None else t
        if base.is_leaf:
            raise CommInputError(
                f"{op}: the tensor that receives the result is a view of a leaf tensor that "
                f"requires grad, and autograd forbids writing into it in place; pass "
                f"t.detach() or run the call under torch.no_grad()"
            )

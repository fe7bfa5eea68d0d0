"""The argument objects hooks receive, with the reference's names (and ``OpName``, from
``operations.names``).

Pre-hooks get ``fn(name: OpName, op_id: int, args)`` where ``args`` is a
``<Op>PreHookArgs`` whose fields follow the reference (``input``/``output`` for gathers,
scatters and all-to-all, ``peer`` for send/recv, ``num_ops`` for batches). Post-hooks get
``fn(op_id, args)`` with a ``CollectivePostHookArgs`` (or ``SplitPostHookArgs``, ...) that
also carries the operation's ``work``. An argument object is built only when a hook is
registered, so the hot path pays nothing.
"""

from __future__ import annotations

import itertools
import warnings
from typing import TYPE_CHECKING, Any

from torchcomms_core.operations.names import OpName as OpName  # re-exported
from torchcomms_core.operations.table import BY_NAME, OPS

if TYPE_CHECKING:
    from torchcomms_core.foundation.work import TorchWork

# One process-wide sequence of operation ids, as the reference has (post id = pre id).
_op_ids = itertools.count()
#: The id hooks see for ``finalize`` (the reference uses 2**64 - 1).
FINALIZE_OP_ID = 2**64 - 1


def next_op_id() -> int:
    """The next process-wide operation id."""
    return next(_op_ids)


def reset_op_ids() -> None:
    """Start operation ids from 0 again (an isolated flight recorder does this)."""
    global _op_ids
    _op_ids = itertools.count()


def op_name(name: str) -> OpName | str:
    """The ``OpName`` of a built-in operation, or the plain name of a plugin collective."""
    member = OpName.__members__.get(name)
    return member if member is not None else name


class OpArgs:
    """Arguments of one operation as pre-hooks see them.

    Reference fields are attributes (``args.input``, ``args.peer``, ...), as are
    ``op_name``, ``op_id``, ``async_op``, ``timeout`` and ``hints``. ``as_dict()`` maps
    the method's parameter names to the values passed.
    """

    __slots__ = ("op_name", "op_id", "async_op", "timeout", "hints", "work", "_values")

    #: The method's parameter names, in order (what ``as_dict()`` keys by).
    fields: tuple[str, ...] = ()
    #: The reference's field names, each mapped to the parameter it reads (``peer`` ->
    #: ``dst`` for ``send``); a plugin collective's are its parameter names.
    hook_fields: dict[str, str] = {}

    def __init__(
        self,
        op_name: str,
        op_id: int,
        values: tuple[Any, ...],
        async_op: bool,
        timeout: Any,
        hints: Any,
    ) -> None:
        #: The operation's name as a plain string (``"all_reduce"``, or a plugin
        #: collective's name); pre-hooks get its ``OpName`` as their first argument.
        self.op_name = op_name
        #: The process-wide id of this operation (``FINALIZE_OP_ID`` for ``finalize``);
        #: its post-hooks see the same.
        self.op_id = op_id
        #: The call's ``async_op`` (``False`` for ``split``, ``new_window`` and ``finalize``).
        self.async_op = async_op
        #: The call's ``timeout`` after checking, a number of seconds made a ``timedelta``
        #: (``None`` when the communicator's default applies, and always for ``split``,
        #: ``new_window`` and ``finalize``).
        self.timeout = timeout
        #: The call's ``hints`` (``None`` when the communicator's hints apply, and always
        #: for ``split``, ``new_window`` and ``finalize``).
        self.hints = hints
        #: The operation's ``TorchWork``, ``NOT_STARTED`` while pre-hooks run and then the
        #: same object the call returns (one already completed for operations that return
        #: none).
        self.work: TorchWork | None = None
        self._values = dict(zip(self.fields, values, strict=False))

    def __getattr__(self, item: str) -> Any:
        values = object.__getattribute__(self, "_values")
        source = type(self).hook_fields.get(item)
        if source is not None:
            return values.get(source)
        if item in values:
            warnings.warn(
                f"{type(self).__name__}.{item} is the old name of this hook field; use the "
                f"reference's names ({', '.join(type(self).hook_fields) or 'none'}), or "
                f"args.as_dict() for the method's parameter names",
                DeprecationWarning,
                stacklevel=2,
            )
            return values[item]
        raise AttributeError(f"{type(self).__name__} has no field {item!r}")

    @property
    def num_ops(self) -> int:
        """Number of operations in a batch (``BatchOpIssuePreHookArgs``)."""
        ops = self._values.get("ops")
        if ops is None:
            raise AttributeError(f"{type(self).__name__} has no field 'num_ops'")
        return len(ops)

    def as_dict(self) -> dict[str, Any]:
        """The operation's arguments by the method's parameter names."""
        return dict(self._values)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={_short(getattr(self, k))}" for k in type(self).hook_fields)
        return f"{type(self).__name__}({inner}, async_op={self.async_op})"


class PostHookArgs:
    """What post-hooks receive: ``op_id``, ``op_name`` and the operation's ``work``.

    The reference's post-hook classes carry no fields; ours also answer the pre-hook
    fields of the same operation (``args.output`` ...) for hooks that want them.
    """

    __slots__ = ("_pre", "work")

    def __init__(self, pre: OpArgs, work: Any) -> None:
        self._pre = pre
        #: The operation's ``TorchWork``, the object its pre-hooks saw as ``args.work``;
        #: completed for a synchronous call and for ``split``, ``new_window`` and
        #: ``finalize`` (which return none), possibly still in progress for an async one.
        self.work = work

    @property
    def op_id(self) -> int:
        """The operation's id, the same its pre-hooks saw."""
        return self._pre.op_id

    @property
    def op_name(self) -> str:
        """The operation's name as a plain string, as its pre-hooks' ``args.op_name``."""
        return self._pre.op_name

    def __getattr__(self, item: str) -> Any:
        if item.startswith("_"):
            raise AttributeError(item)
        return getattr(object.__getattribute__(self, "_pre"), item)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(op_id={self.op_id}, work={self.work!r})"


class CollectivePostHookArgs(PostHookArgs):
    """What post-hooks of an operation without a class of its own receive: the collectives,
    ``send`` and ``recv``, and plugin collectives (``op_id``, ``op_name``, ``work``)."""

    __slots__ = ()


class SplitPostHookArgs(PostHookArgs):
    """What post-hooks of ``split`` receive, once the sub-communicator exists (on a rank
    outside ``ranks``, before ``split`` returns ``None``)."""

    __slots__ = ()


class NewWindowPostHookArgs(PostHookArgs):
    """What post-hooks of ``new_window`` receive, once the window is built (and its tensor
    registered, when one was given)."""

    __slots__ = ()


class BatchOpIssuePostHookArgs(PostHookArgs):
    """What post-hooks of ``BatchSendRecv.issue`` receive."""

    __slots__ = ()


class FinalizePostHookArgs(PostHookArgs):
    """What post-hooks of ``finalize`` receive, after the backend is finalized (``op_id`` is
    ``FINALIZE_OP_ID``, ``2**64 - 1``)."""

    __slots__ = ()


_POST_CLASSES: dict[str, type[PostHookArgs]] = {
    "split": SplitPostHookArgs,
    "new_window": NewWindowPostHookArgs,
    "batch_op_issue": BatchOpIssuePostHookArgs,
    "finalize": FinalizePostHookArgs,
}


def post_args(pre: OpArgs, work: Any) -> PostHookArgs:
    """The post-hook object of an operation whose pre-hook object is ``pre``."""
    return _POST_CLASSES.get(pre.op_name, CollectivePostHookArgs)(pre, work)


def _short(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"Tensor{tuple(shape)}:{str(getattr(value, 'dtype', '')).replace('torch.', '')}"
    if isinstance(value, list) and len(value) > 4:
        return f"[{len(value)} items]"
    return repr(value)


def _class_name(op: str) -> str:
    return "".join(part.capitalize() for part in op.split("_")) + "PreHookArgs"


def _class_doc(op: str, fields: tuple[str, ...], hook_fields: dict[str, str]) -> str:
    """The docstring of ``op``'s pre-hook class: the operation and the fields it answers."""
    if op in OpName.__members__:
        method = BY_NAME[op].where
        head = f"Arguments of ``{method}`` as pre-hooks see them."
    else:
        head = f"Arguments of the plugin collective ``TorchComm.{op}`` as pre-hooks see them."
    named = [
        f"``{field}``" + ("" if param == field else f" (the method's ``{param}``)")
        for field, param in hook_fields.items()
    ]
    if "ops" in fields:
        named.append("``num_ops`` (the number of operations in ``ops``)")
    listed = f"Fields: {', '.join(named)}." if named else "No fields of the operation's own."
    return (
        f"{head}\n\n{listed} Every ``OpArgs`` also has ``op_name``, ``op_id``, ``async_op``, "
        f"``timeout``, ``hints`` and ``work``; ``as_dict()`` gives the arguments by the "
        f"method's parameter names."
    )


def _make(op: str, fields: tuple[str, ...], hook_fields: dict[str, str]) -> type[OpArgs]:
    return type(
        _class_name(op),
        (OpArgs,),
        {
            "__slots__": (),
            "__doc__": _class_doc(op, fields, hook_fields),
            "fields": fields,
            "hook_fields": hook_fields,
            "__module__": __name__,
        },
    )


ARGS_CLASSES: dict[str, type[OpArgs]] = {
    op.name: _make(op.name, op.fields, op.hook_fields) for op in OPS
}
for _cls in ARGS_CLASSES.values():
    _cls.__qualname__ = _cls.__name__
    globals()[_cls.__name__] = _cls

#: Every pre-hook class by its reference name.
PRE_HOOK_CLASSES: dict[str, type[OpArgs]] = {c.__name__: c for c in ARGS_CLASSES.values()}
#: Every post-hook class by name.
POST_HOOK_CLASSES: dict[str, type[PostHookArgs]] = {
    c.__name__: c
    for c in (
        CollectivePostHookArgs,
        SplitPostHookArgs,
        NewWindowPostHookArgs,
        BatchOpIssuePostHookArgs,
        FinalizePostHookArgs,
    )
}


def args_class(op: str, fields: tuple[str, ...] = ()) -> type[OpArgs]:
    """Return (creating once) the argument class of ``op``; used for plugin collectives too.

    A plugin collective's fields are its parameter names, exposed as attributes too.
    """
    cls = ARGS_CLASSES.get(op)
    if cls is None:
        cls = _make(op, fields, {f: f for f in fields})
        ARGS_CLASSES[op] = cls
    return cls

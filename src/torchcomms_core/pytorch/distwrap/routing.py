"""Where a distwrap call runs: ``torch.distributed``'s group routing, written once.

Every distwrap call with a ``group`` argument does the same first steps: a rank outside
the group (``GroupMember.NON_GROUP_MEMBER``) gets the non-member answer, a group that is
not a torchcomms one hands the call, with the caller's own arguments, to
``torch.distributed``, and only a torchcomms group runs the body. :func:`on_group` makes
those steps a decorator; :func:`group_rank_of` reads a rank given globally or in the group.

May import :mod:`.world` (the groups), torch and ``foundation``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

import torch.distributed as dist

from torchcomms_core.foundation.errors import CommInputError
from torchcomms_core.pytorch.distwrap.world import TorchCommsGroup, resolve

P = ParamSpec("P")
R = TypeVar("R")

_NON_MEMBER = dist.GroupMember.NON_GROUP_MEMBER


def on_group(
    fallback: Callable[..., Any], non_member: Any = None
) -> Callable[[Callable[Concatenate[TorchCommsGroup, P], R]], Callable[P, Any]]:
    """Route a distwrap call as ``torch.distributed`` routes its own.

    The decorated ``body(pg, *args, **kwargs)`` has the public signature after ``pg`` (a
    ``group`` parameter among it) and runs on the torchcomms group ``pg``. A non-member
    rank gets ``non_member``; a group torchcomms does not serve, ``fallback(*args,
    **kwargs)`` (the ``torch.distributed`` function of the same name).
    """

    def wrap(body: Callable[Concatenate[TorchCommsGroup, P], R]) -> Callable[P, Any]:
        name = body.__name__
        signature = inspect.signature(body)
        public = list(signature.parameters.values())[1:]
        names = frozenset(p.name for p in public)
        at = [p.name for p in public].index("group")
        own = signature.replace(parameters=public)

        @functools.wraps(body)
        def call(*args: P.args, **kwargs: P.kwargs) -> Any:
            if len(args) > len(public) or not names.issuperset(kwargs):
                try:  # arguments the public signature does not take
                    own.bind(*args, **kwargs)
                except TypeError as exc:
                    raise TypeError(f"{name}(): {exc}") from None
            group = args[at] if len(args) > at else kwargs.get("group")
            if group is _NON_MEMBER:
                return non_member
            pg = resolve(group, name)
            if pg is None:
                return fallback(*args, **kwargs)
            return body(pg, *args, **kwargs)

        call.__signature__ = own  # type: ignore[attr-defined]
        return call

    return wrap


def group_rank_of(
    group: TorchCommsGroup,
    rank: int | None,
    group_rank: int | None,
    what: str,
    arg: str,
    default: int | None = 0,
) -> int:
    """The group rank of a root or peer given as a global rank (``src``/``dst``) or a
    group rank (``group_src``/``group_dst``); ``default`` when neither is given (``None``:
    one must be)."""
    if rank is not None and group_rank is not None:
        if default is None:
            raise CommInputError(f"{what}: pass {arg}= or group_{arg}=, not both")
        raise CommInputError(
            f"{what}: pass {arg}= (a global rank) or group_{arg}= (a rank in the group), not both"
        )
    if group_rank is not None:
        return int(group_rank)
    if rank is None:
        if default is None:
            raise CommInputError(f"{what}: pass {arg}= (a global rank) or group_{arg}=")
        return default
    return group.group_rank(rank, what)

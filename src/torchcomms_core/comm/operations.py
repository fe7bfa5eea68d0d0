"""``TorchComm``: the communicator users hold (``new_comm`` builds it, in ``comm.create``).

The operations of the operation table are ``Face``'s methods (``comm.face``, written from
the table); this class adds the rest: plugin collectives, batches, windows, the persistent
all-gather, ``split`` and ``reconfigure``. ``CommBase`` (``comm.base``) owns the state, the
hooks and the backend call.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch

from torchcomms_core.comm.batch import BatchSendRecv
from torchcomms_core.comm.collectives import make_method
from torchcomms_core.comm.face import Face
from torchcomms_core.comm.handles import PersistentAllGather, owned
from torchcomms_core.comm.window import TorchCommWindow, create_window
from torchcomms_core.creation.join import join_or_finalize, members_key
from torchcomms_core.creation.names import check_name, claim_name, release_name
from torchcomms_core.foundation.errors import CommInputError, CommStateError, TorchCommError
from torchcomms_core.foundation.states import OK
from torchcomms_core.foundation.work import TorchWork
from torchcomms_core.operations.validation import check_hints, check_timeout
from torchcomms_core.plugin_host.collective import Collective
from torchcomms_core.plugin_host.manager import PluginError, attach_collective_host, call_lifecycle
from torchcomms_core.plugin_host.tuners import agree_after_init, confirm_tuning, make_tuning


class TorchComm(Face):
    """An eagerly initialised communicator over one backend and one device.

    Every operation takes ``async_op`` (return at once; wait on the returned work),
    ``hints`` (``dict[str, str]`` for the backend) and ``timeout`` (a ``timedelta`` or
    seconds; default :meth:`get_timeout`), and returns a :class:`TorchWork`. Every
    operation may raise :class:`CommStateError` (finalized, aborted or failed
    communicator) and, before anything is sent, :class:`CommTypeError` or
    :class:`CommInputError` for a bad argument. Engine failures raise
    :class:`CommTimeoutError` or :class:`CommOperationError` from the call (synchronous)
    or from ``wait()`` (asynchronous) and mark the communicator failed.
    """

    # -- plugin collectives ------------------------------------------------------------

    @classmethod
    def _add_collective(cls, coll: Collective) -> None:
        """Install a plugin collective as a method (the plugin host calls this)."""
        if hasattr(cls, coll.name):
            raise PluginError(
                f"{coll.provider} registers collective {coll.name!r}, which is "
                f"already a built-in TorchComm method; pick another name"
            )
        setattr(cls, coll.name, make_method(coll))

    @classmethod
    def _remove_collective(cls, name: str) -> None:
        if getattr(cls.__dict__.get(name), "_plugin_collective", False):
            delattr(cls, name)

    # -- batches, windows and persistent all-gather -----------------------------------

    def batch_op_create(self) -> BatchSendRecv:
        """Start a batch of sends and receives, issued together by its ``issue()``."""
        self._check_usable("batch_op_create")
        return BatchSendRecv(self)

    def new_window(self, tensor: torch.Tensor | None = None) -> TorchCommWindow:
        """Create a one-sided window (collective); registers ``tensor`` at once if given.

        Raises :class:`CommStateError` when the backend has no windows
        (``method_support()["new_window"]``). See :class:`TorchCommWindow`.
        """
        if self._state is not OK:
            self._ensure_usable("new_window")
        return create_window(self, tensor)

    def all_gather_p_init(
        self,
        output: torch.Tensor,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> PersistentAllGather:
        """Bind ``output`` for repeated all-gathers; returns the handle ``exec`` takes."""
        self._guard("all_gather_p_init", timeout, hints)
        self._check.tensor("all_gather_p_init", "output", output)
        if output.numel() % self._size:
            raise CommInputError(
                f"all_gather_p_init: output has {output.numel()} elements, not "
                f"a multiple of the communicator size {self._size}"
            )
        return PersistentAllGather(self, output)

    def all_gather_p_exec(
        self,
        handle: PersistentAllGather,
        input: torch.Tensor,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Gather every rank's ``input`` into the output bound by ``all_gather_p_init``."""
        output = owned(handle, self, "all_gather_p_exec").output
        if output is None:
            raise CommStateError("all_gather_p_exec: the handle was freed by all_gather_p_free")
        return self.all_gather_single(output, input, async_op, hints, timeout)

    def all_gather_p_free(self, handle: PersistentAllGather) -> None:
        """Release a handle from ``all_gather_p_init``; it cannot be executed again."""
        owned(handle, self, "all_gather_p_free").output = None

    # -- sub-communicators -----------------------------------------------------------

    def reconfigure(
        self,
        uuid: int | str,
        init_handles: list[str] | set[str],
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> TorchWork:
        """Bind the communicator to exactly the members ``init_handles`` names (fault tolerance).

        Rank is the caller's position in the list (sorted order for a set), size its length;
        ``uuid`` must be new for this communicator. Completed on return. Raises
        :class:`CommInputError` when members disagree and :class:`CommTimeoutError` when one
        never arrives. See docs/fault-tolerance.md.
        """
        from torchcomms_core.comm.reconfigure import (
            reconfigure,  # fault tolerance loads only when used
        )

        return reconfigure(self, uuid, init_handles, timeout, hints)

    def split(
        self,
        ranks: Sequence[int],
        name: str,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchComm | None:
        """Create a sub-communicator of ``ranks`` (parent ranks); non-members pass ``[]``.

        Members get a ``TorchComm`` whose ranks follow the sorted order of ``ranks``;
        non-members get ``None``. Every member must pass the same list and ``name``.
        """
        if self._state is not OK:
            self._ensure_usable("split")
        check_name(name, "split")
        members = self._check.split_ranks(ranks)
        hints = check_hints(hints, "split") if hints is not None else None
        timeout = check_timeout(timeout, "split") if timeout is not None else self._timeout
        hook_args = self._hooks_before("split", (list(ranks), name))
        from torch._C._distributed_c10d import PrefixStore  # torch.distributed loads on first use

        store = PrefixStore(f"split/{name}/{members_key(members)}", self._store)
        options = self._options.replace(
            name=name,
            store=store,
            timeout=timeout,
            hints={**self._hints, **(hints or {})},
            rank=members.index(self._rank) if members else -1,
            size=len(members),
            tuning=None,
        )
        if not members:
            # Backends with a collective native split need every parent rank to take part.
            if self._support["split"] == "native":
                self._backend.split([], name, options)
            self._hooks_after(hook_args)
            return None
        claim_name(self._store, f"split/{name}", self._rank, self._name)
        try:
            # The members agree on the child's tuner on its store, before its engine (#45).
            shared = getattr(self._backend.tuning, "shared", True)
            options.tuning = make_tuning(
                self._backend,
                self._backend_name,
                self._device,
                options,
                shared_store=shared,
                what=f"split: communicator {name!r} of {self._name!r}",
                claim_key=lambda r: f"names/split/{name}/{r}",
                claims=self._store,
                members=members,
            )
            child = self._backend.split(members, name, options)
            if child is None:
                raise TorchCommError(
                    f"split: backend {self.get_backend()!r} returned no "
                    f"communicator for members {members}"
                )
            if not child.init_waits_for_peers():
                join_or_finalize(
                    child,
                    store,
                    len(members),
                    options.timeout,
                    f"split: communicator {name!r} of {self._name!r}",
                    claim_key=lambda r: f"names/split/{name}/{r}",
                    claims=self._store,
                    members=members,
                )
            if shared:
                confirm_tuning(child.tuning)
            else:
                agree_after_init(child.tuning, child, self._backend_name, self._device)
        except BaseException:
            release_name(self._store, f"split/{name}", self._rank)
            raise
        comm = TorchComm(child, self._device, name, options, store, self._backend_name)
        self._hooks_after(hook_args)
        call_lifecycle("torchcomms_comm_created", comm=comm, parent=self)
        return comm


attach_collective_host(TorchComm._add_collective, TorchComm._remove_collective)

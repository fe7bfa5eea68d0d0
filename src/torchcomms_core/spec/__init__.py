"""The backend spec: ``TorchCommBackend``, the contract every backend plugin implements.

A backend writes the required primitives (lifecycle, ``send``, ``recv``); every other
operation has a portable default here, written against those primitives. Overriding a
default makes it *native*; :func:`method_support` tells which is which.
"""

from __future__ import annotations

import abc
import enum
import inspect
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from torchcomms_core.operations.reduce_op import RedOpType, ReduceOp
from torchcomms_core.operations.table import DERIVED, names

if TYPE_CHECKING:
    from torchcomms_core.operations.options import CommOptions

#: Version of this spec. A backend declares the version it targets in ``spec_version``.
#: Same major and a minor no newer than the core's: compatible.
SPEC_VERSION = "1.0"

#: What a backend must implement itself.
REQUIRED_METHODS: tuple[str, ...] = (
    "init",
    "finalize",
    "get_rank",
    "get_size",
    "get_backend_name",
    "get_comm_name",
    "send",
    "recv",
)

#: Operations with a portable default in the spec (native when a backend overrides them).
DERIVABLE_METHODS: tuple[str, ...] = names(support=DERIVED)

#: Capabilities a backend may offer; absent ones are reported as unsupported.
OPTIONAL_METHODS: tuple[str, ...] = (
    "abort",
    "new_window",
    "recv_anysource",
    "reconfigure_engine",
    "send_tagged",
    "recv_tagged",
)

#: The element types a backend accepts unless it declares ``supported_dtypes`` itself.
DEFAULT_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
)

#: The reductions a backend performs unless it declares ``supported_reduce_ops`` itself
#: (every one but ``AVG`` and ``PREMUL_SUM``, which the core derives from ``SUM``).
BASIC_REDUCE_OPS = frozenset(
    {
        RedOpType.SUM,
        RedOpType.PRODUCT,
        RedOpType.MIN,
        RedOpType.MAX,
        RedOpType.BAND,
        RedOpType.BOR,
        RedOpType.BXOR,
    }
)

#: One operation of a batch as a backend receives it: ``("send" | "recv", tensor, peer)``
#: (the user-facing ``P2POp`` unpacks to this).
BatchOp = tuple[str, torch.Tensor, int]


class TorchCommWinAccessType(enum.IntEnum):
    """How a rank reaches a peer's window memory."""

    #: Direct loads and stores (same host shared memory, NVLink), so ``map_remote_tensor`` works.
    WIN_ACCESS_TYPE_UNIFIED = 0
    #: Through the engine only (network RMA).
    WIN_ACCESS_TYPE_SEPARATE = 1


class WindowEngine(Protocol):
    """What a backend's ``new_window()`` returns. Offsets and counts are in elements.

    ``register`` and ``deregister`` are collective. ``put``/``signal``/``wait_signal``
    return ``None`` when done or an object with ``wait()``; the core has checked every
    argument. ``signal(peer)`` must make earlier puts to ``peer`` visible before the
    peer's ``wait_signal`` returns.
    """

    def register(self, tensor: torch.Tensor) -> list[int]:
        """Expose ``tensor`` (contiguous); return every rank's element count."""

    def deregister(self) -> None:
        """Withdraw the registered tensor (collective: every rank calls it).

        No ``put`` to this window follows until the next ``register``.
        """

    def put(
        self, tensor: torch.Tensor, dst_rank: int, offset: int, async_op: bool, timeout: timedelta
    ) -> Any:
        """Write ``tensor`` into ``dst_rank``'s registered tensor, starting at element ``offset``.

        Args:
            tensor: contiguous data of the window's dtype; the core has checked it fits.
            dst_rank: the destination rank (may be this rank).
            offset: the first element written in the destination's registered tensor.
            async_op: return a work instead of completing before returning.
            timeout: the deadline for this call.

        Returns:
            ``None`` when the write is done, or an object with ``wait()``.

        Raises:
            The engine's error when the write fails or does not finish within ``timeout``.
        """

    def signal(self, peer_rank: int, async_op: bool, timeout: timedelta) -> Any:
        """Tell ``peer_rank`` that this rank's earlier puts to it are visible there.

        Args:
            peer_rank: the rank signalled.
            async_op: return a work instead of completing before returning.
            timeout: the deadline for this call.

        Returns:
            ``None`` when sent, or an object with ``wait()``.

        Raises:
            The engine's error when the signal cannot be delivered within ``timeout``.
        """

    def wait_signal(self, peer_rank: int, async_op: bool, timeout: timedelta) -> Any:
        """Wait for one ``signal`` from ``peer_rank``; each signal is consumed by one wait.

        Args:
            peer_rank: the rank whose signal is awaited.
            async_op: return a work instead of waiting before returning.
            timeout: how long to wait for the signal.

        Returns:
            ``None`` once the signal arrived, or an object with ``wait()``.

        Raises:
            The engine's error when no signal arrives within ``timeout``.
        """

    def access_type(self, peer_rank: int) -> TorchCommWinAccessType:
        """How this rank reaches ``peer_rank``'s registered tensor.

        ``WIN_ACCESS_TYPE_UNIFIED`` promises that :meth:`map_remote` works for that peer.
        """

    def map_remote(self, rank: int) -> torch.Tensor:
        """``rank``'s registered tensor as a flat tensor this process can load from and store to.

        Called by the core only for peers whose :meth:`access_type` is ``WIN_ACCESS_TYPE_UNIFIED``.
        """

    def free(self, abort: bool = False) -> None:
        """Release the engine and the memory it registered.

        Args:
            abort: ``True`` when the communicator is going away (after an error or ``abort()``):
                release without the collective handshake with the peers.
        """


class TorchCommBackend(abc.ABC):
    """Abstract backend. Subclass it, implement the required methods, register it.

    Collectives take the public API's positional arguments plus ``async_op``, and keyword
    ``timeout`` (a ``timedelta``, already resolved by the core) and ``hints``. They return
    ``None`` when the operation is complete, or an object with ``wait()`` (optionally
    ``is_completed()``) when it is still running; ``wait()`` raises if it failed.
    The core validates every argument, makes tensors contiguous and resolves
    ``AVG``/``PREMUL_SUM`` before a backend sees them.
    """

    #: Spec version this backend was written against.
    spec_version: ClassVar[str] = SPEC_VERSION
    #: Device types this backend runs on.
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    #: Reductions the backend performs natively (the core derives AVG and PREMUL_SUM).
    supported_reduce_ops: ClassVar[frozenset[RedOpType]] = BASIC_REDUCE_OPS
    #: Element types the backend accepts.
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = DEFAULT_DTYPES
    #: ``False`` for engines that rendezvous by themselves (MPI); without ``MASTER_ADDR``
    #: the core then gives the communicator a store local to the process.
    needs_store: ClassVar[bool] = True
    #: ``"mpiexec"`` when the ranks must be MPI processes started by ``mpiexec``; tools that
    #: start ranks themselves (``torchcomms bench``, the conformance suite) then use it.
    launcher: ClassVar[str | None] = None
    #: The hint keys this backend reads (``new_comm(..., hints=...)``); a key ending in
    #: ``*`` stands for every key with that prefix (``"ncclx::*"``). A hint the backend
    #: does not list is reported once with a warning. ``None``: not declared, not checked.
    hint_keys: ClassVar[tuple[str, ...] | None] = None
    #: ``False`` for backends whose operations do not really communicate (``fake``); the
    #: conformance suite then runs only its API-shape contracts, not the numerical ones.
    communicates: ClassVar[bool] = True
    #: Whether ``send``/``recv`` may name this rank itself (the reference's core passes
    #: such calls to the backend unchecked). ``False``: the core refuses them with a clear
    #: error first, for engines that cannot (c10d's, MPI's blocking paths).
    allows_self_p2p: ClassVar[bool] = True

    device: torch.device
    comm_name: str
    options: CommOptions

    # -- availability -----------------------------------------------------------------

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        """Return ``(runnable here, reason)`` without creating a communicator."""
        return True, "ok"

    @classmethod
    def own_rank_size(cls, hints: dict[str, str]) -> tuple[int, int] | None:
        """``(rank, size)`` for a backend that knows them without a launcher (the fake
        backend reads them from its hints); ``None`` (the default): ask the launcher."""
        return None

    @classmethod
    def reconfigure_support(cls) -> tuple[bool, str]:
        """Return ``(can reconfigure here, reason)``: whether ``reconfigure_engine`` works.

        The default says yes when the class implements ``reconfigure_engine``; a backend
        whose engine offers it only on some builds checks at run time.
        """
        if _overrides(cls, "reconfigure_engine"):
            return True, "ok"
        return False, f"{cls.__name__} does not implement reconfigure_engine"

    @classmethod
    def rendezvous_address(cls, hints: dict[str, str]) -> str | None:
        """Where peers reach this process: the address a self-hosted rendezvous listens on.

        Used by ``new_comm(..., enable_reconfigure=True)`` without a store. ``None`` (the
        default) listens on the address this host's name resolves to (the loopback address
        if it does not); a backend bound to one interface (hints, environment) returns that
        interface's address. The store listens on that one address only.
        """
        return None

    # -- lifecycle (required) ---------------------------------------------------------

    def _bind(self, device: torch.device, name: str, options: CommOptions) -> None:
        """Record device, name and options; the core calls this right before ``init``."""
        self.device = device
        self.comm_name = name
        self.options = options

    @abc.abstractmethod
    def init(self, device: torch.device, name: str, options: CommOptions) -> None:
        """Create the engine's communicator; ``options`` carries store, rank and size."""

    def init_waits_for_peers(self) -> bool:
        """Whether ``init`` returned only once every rank's ``init`` had begun.

        True (the default) for engines whose creation is collective: an eager full mesh,
        ``MPI_Init``, ``ncclCommInitRank``. A backend whose engine connects on first use
        (gloo's ``lazy`` hint) returns False, and the core then joins the ranks with a
        two-operation store barrier, so ``new_comm`` and ``split`` still prove that every
        rank arrived and name the ones that did not.
        """
        return True

    @abc.abstractmethod
    def finalize(self) -> None:
        """Release the engine's resources. Called once; no operation follows."""

    @abc.abstractmethod
    def get_rank(self) -> int:
        """This process's rank in the communicator: ``0 <= rank < get_size()``.

        After ``reconfigure_engine`` it returns the new rank.
        """

    @abc.abstractmethod
    def get_size(self) -> int:
        """The number of ranks in the communicator (the new number after ``reconfigure_engine``)."""

    @abc.abstractmethod
    def get_backend_name(self) -> str:
        """The backend's name (``"gloo"``), reported by ``TorchComm.get_backend()``."""

    @abc.abstractmethod
    def get_comm_name(self) -> str:
        """The communicator's name, as given to ``init`` (``self.comm_name``)."""

    def set_timeout(self, timeout: timedelta) -> None:
        """Change the default timeout (the core passes a timeout with every call anyway)."""
        self.options.timeout = timeout

    # -- point to point (required) ----------------------------------------------------

    @abc.abstractmethod
    def send(
        self,
        tensor: torch.Tensor,
        dst: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Send ``tensor`` to ``dst``. With ``async_op=True`` it must not block on the peer."""

    @abc.abstractmethod
    def recv(
        self,
        tensor: torch.Tensor,
        src: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Receive into ``tensor`` from ``src``. With ``async_op=True`` it must not block."""

    # -- portable defaults ------------------------------------------------------------

    def batch_op_issue(
        self,
        ops: Sequence[BatchOp],
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Issue every send and receive of ``ops`` before waiting for any of them."""
        works = []
        for kind, tensor, peer in ops:
            method = self.send if kind == "send" else self.recv
            work = method(tensor, peer, True, timeout=timeout, hints=hints)
            if work is not None:
                works.append(work)
        return _settle(MultiWork(works) if works else None, async_op)

    def broadcast(
        self,
        tensor: torch.Tensor,
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Copy ``root``'s ``tensor`` into ``tensor`` on every rank.

        Default: ``root`` sends to every peer and the others receive, in one :meth:`batch_op_issue`.

        Args:
            tensor: the data on ``root``, the destination elsewhere; one shape and dtype on
                every rank.
            root: the rank whose tensor is sent.
                async_op: return a work to wait on instead of completing before returning.
                timeout: the deadline for this call, already resolved by the core.
                hints: the call's hints merged with the communicator's.

            Returns:
                ``None`` once complete, or a work (``wait()``, optionally ``is_completed()``).

            Raises:
                Whatever the backend's ``send``, ``recv`` and their works raise (from ``wait()``
                when ``async_op`` is true).
        """
        me, n = self.get_rank(), self.get_size()
        if me == root:
            ops = [("send", tensor, peer) for peer in range(n) if peer != me]
        else:
            ops = [("recv", tensor, root)]
        return self.batch_op_issue(ops, async_op, timeout=timeout, hints=hints)

    def all_gather_v(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Gather every rank's ``tensor`` into ``tensor_list`` on every rank; sizes may differ.

        Default: this rank copies its own entry and exchanges with every peer in one
        :meth:`batch_op_issue`.

        Args:
            tensor_list: one tensor per rank; ``tensor_list[r]`` receives rank ``r``'s ``tensor``
                and has its shape.
            tensor: this rank's contribution.
                async_op: return a work to wait on instead of completing before returning.
                timeout: the deadline for this call, already resolved by the core.
                hints: the call's hints merged with the communicator's.

            Returns:
                ``None`` once complete, or a work (``wait()``, optionally ``is_completed()``).

            Raises:
                Whatever the backend's ``send``, ``recv`` and their works raise (from ``wait()``
                when ``async_op`` is true).
        """
        me, n = self.get_rank(), self.get_size()
        tensor_list[me].copy_(tensor)
        ops: list[BatchOp] = []
        for peer in range(n):
            if peer != me:
                ops.append(("send", tensor, peer))
                ops.append(("recv", tensor_list[peer], peer))
        return self.batch_op_issue(ops, async_op, timeout=timeout, hints=hints)

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Gather every rank's ``tensor`` into ``tensor_list`` on every rank (equal shapes).

        Default: :meth:`all_gather_v`.

        Args:
            tensor_list: one tensor per rank, each of ``tensor``'s shape; ``tensor_list[r]``
                receives rank ``r``'s ``tensor``.
            tensor: this rank's contribution.
                async_op: return a work to wait on instead of completing before returning.
                timeout: the deadline for this call, already resolved by the core.
                hints: the call's hints merged with the communicator's.

            Returns:
                ``None`` once complete, or a work (``wait()``, optionally ``is_completed()``).

            Raises:
                Whatever the backend's ``send``, ``recv`` and their works raise (from ``wait()``
                when ``async_op`` is true).
        """
        return self.all_gather_v(tensor_list, tensor, async_op, timeout=timeout, hints=hints)

    def all_gather_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Gather every rank's ``input`` into one tensor: rank ``r``'s in ``output``'s chunk ``r``.

        Default: :meth:`all_gather` into equal flat views of ``output`` (:func:`flat_chunks`).

        Args:
            output: ``get_size() * input.numel()`` elements, on every rank.
            input: this rank's contribution.
                async_op: return a work to wait on instead of completing before returning.
                timeout: the deadline for this call, already resolved by the core.
                hints: the call's hints merged with the communicator's.

            Returns:
                ``None`` once complete, or a work (``wait()``, optionally ``is_completed()``).

            Raises:
                Whatever the backend's ``send``, ``recv`` and their works raise (from ``wait()``
                when ``async_op`` is true).
        """
        chunks = flat_chunks(output, self.get_size())
        return self.all_gather(chunks, input.view(-1), async_op, timeout=timeout, hints=hints)

    def all_to_all(
        self,
        output_tensor_list: list[torch.Tensor],
        input_tensor_list: list[torch.Tensor],
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Send ``input_tensor_list[p]`` to rank ``p``; receive its into ``output_tensor_list[p]``.

        Default: this rank's own entry is copied locally, every peer is exchanged with in one
        :meth:`batch_op_issue`.

        Args:
            output_tensor_list: one tensor per rank; entry ``p`` receives what rank ``p`` sent
                to this rank.
            input_tensor_list: one tensor per rank; entry ``p`` is sent to rank ``p``.
                async_op: return a work to wait on instead of completing before returning.
                timeout: the deadline for this call, already resolved by the core.
                hints: the call's hints merged with the communicator's.

            Returns:
                ``None`` once complete, or a work (``wait()``, optionally ``is_completed()``).

            Raises:
                Whatever the backend's ``send``, ``recv`` and their works raise (from ``wait()``
                when ``async_op`` is true).
        """
        me, n = self.get_rank(), self.get_size()
        output_tensor_list[me].copy_(input_tensor_list[me])
        ops: list[BatchOp] = []
        for peer in range(n):
            if peer != me:
                ops.append(("send", input_tensor_list[peer], peer))
                ops.append(("recv", output_tensor_list[peer], peer))
        return self.batch_op_issue(ops, async_op, timeout=timeout, hints=hints)

    def all_to_all_v_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """All-to-all over dim 0 of one input and one output tensor, with per-rank block sizes.

        Default: :meth:`all_to_all` over the blocks (:func:`split_dim0`).

        Args:
            output: receives rank ``p``'s block for this rank as its ``p``-th block along dim 0.
            input: block ``p`` along dim 0 is sent to rank ``p``.
            output_split_sizes: the rows of each output block; empty: ``get_size()`` equal blocks.
            input_split_sizes: the rows of each input block; empty: ``get_size()`` equal blocks.
                async_op: return a work to wait on instead of completing before returning.
                timeout: the deadline for this call, already resolved by the core.
                hints: the call's hints merged with the communicator's.

            Returns:
                ``None`` once complete, or a work (``wait()``, optionally ``is_completed()``).

            Raises:
                Whatever the backend's ``send``, ``recv`` and their works raise (from ``wait()``
                when ``async_op`` is true).
        """
        n = self.get_size()
        outs = split_dim0(output, output_split_sizes, n)
        ins = split_dim0(input, input_split_sizes, n)
        return self.all_to_all(outs, ins, async_op, timeout=timeout, hints=hints)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """All-to-all over dim 0 in equal blocks: block ``p`` of ``input`` goes to rank ``p``.

        Default: :meth:`all_to_all_v_single` with empty split sizes.

        Args:
            output: receives rank ``p``'s block for this rank as its ``p``-th block along dim 0.
            input: dim 0 divides by ``get_size()``; block ``p`` is sent to rank ``p``.
                async_op: return a work to wait on instead of completing before returning.
                timeout: the deadline for this call, already resolved by the core.
                hints: the call's hints merged with the communicator's.

            Returns:
                ``None`` once complete, or a work (``wait()``, optionally ``is_completed()``).

            Raises:
                Whatever the backend's ``send``, ``recv`` and their works raise (from ``wait()``
                when ``async_op`` is true).
        """
        return self.all_to_all_v_single(
            output, input, [], [], async_op, timeout=timeout, hints=hints
        )

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Reduce ``tensor`` over every rank with ``op``; every rank's ``tensor`` holds the result.

        Default: every rank gathers every contribution (:meth:`all_gather_single` into a
        temporary of ``get_size()`` times ``tensor``'s size) and reduces the rows in rank order, so
        the result is bit-identical on every rank.

        Args:
            tensor: this rank's contribution, overwritten with the result.
            op: a reduction in :attr:`supported_reduce_ops` (the core has resolved ``AVG`` and
                ``PREMUL_SUM`` already).
                async_op: return a work to wait on instead of completing before returning.
                timeout: the deadline for this call, already resolved by the core.
                hints: the call's hints merged with the communicator's.

            Returns:
                ``None`` once complete, or a work (``wait()``, optionally ``is_completed()``).

            Raises:
                Whatever the backend's ``send``, ``recv`` and their works raise (from ``wait()``
                when ``async_op`` is true).
        """
        # Every rank gathers every contribution and reduces them in rank order, so the
        # result is bit-identical on all ranks.
        n = self.get_size()
        flat = tensor.view(-1)
        gathered = torch.empty((n, flat.numel()), dtype=tensor.dtype, device=tensor.device)
        work = self.all_gather_single(gathered, flat, async_op, timeout=timeout, hints=hints)

        def reduce_locally() -> None:
            flat.copy_(reduce_rows(gathered, op.type))

        return then(work, reduce_locally)

    def reduce(
        self,
        tensor: torch.Tensor,
        root: int,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Reduce ``tensor`` over every rank with ``op`` into ``root``'s ``tensor``.

        Default: :meth:`all_reduce`, on a copy of ``tensor`` on ranks other than ``root``.

        Args:
            tensor: this rank's contribution; on ``root`` overwritten with the result, left
                unchanged elsewhere.
            root: the rank that receives the result.
            op: a reduction in :attr:`supported_reduce_ops`.
                async_op: return a work to wait on instead of completing before returning.
                timeout: the deadline for this call, already resolved by the core.
                hints: the call's hints merged with the communicator's.

            Returns:
                ``None`` once complete, or a work (``wait()``, optionally ``is_completed()``).

            Raises:
                Whatever the backend's ``send``, ``recv`` and their works raise (from ``wait()``
                when ``async_op`` is true).
        """
        target = tensor if self.get_rank() == root else tensor.clone()
        return self.all_reduce(target, op, async_op, timeout=timeout, hints=hints)

    def reduce_scatter_v(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Reduce ``input_list[r]`` over every rank into rank ``r``'s ``output``; sizes may differ.

        Default: an :meth:`all_to_all` delivers every rank's block for this rank, which is then
        reduced locally in rank order.

        Args:
            output: this rank's result: the reduction of every rank's ``input_list[rank]``.
            input_list: one tensor per rank; entry ``r`` has rank ``r``'s output size.
            op: a reduction in :attr:`supported_reduce_ops`.
                async_op: return a work to wait on instead of completing before returning.
                timeout: the deadline for this call, already resolved by the core.
                hints: the call's hints merged with the communicator's.

            Returns:
                ``None`` once complete, or a work (``wait()``, optionally ``is_completed()``).

            Raises:
                Whatever the backend's ``send``, ``recv`` and their works raise (from ``wait()``
                when ``async_op`` is true).
        """
        # Each rank receives every peer's block for it and reduces them in rank order.
        n = self.get_size()
        flat_out = output.view(-1)
        received = torch.empty((n, flat_out.numel()), dtype=output.dtype, device=output.device)
        work = self.all_to_all(
            list(received.unbind(0)),
            [t.view(-1) for t in input_list],
            async_op,
            timeout=timeout,
            hints=hints,
        )

        def reduce_locally() -> None:
            flat_out.copy_(reduce_rows(received, op.type))

        return then(work, reduce_locally)

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Reduce ``input_list[r]`` over every rank into rank ``r``'s ``output`` (equal sizes).

        Default: :meth:`reduce_scatter_v`.

        Args:
            output: this rank's result: the reduction of every rank's ``input_list[rank]``.
            input_list: one tensor per rank, each of ``output``'s size.
            op: a reduction in :attr:`supported_reduce_ops`.
                async_op: return a work to wait on instead of completing before returning.
                timeout: the deadline for this call, already resolved by the core.
                hints: the call's hints merged with the communicator's.

            Returns:
                ``None`` once complete, or a work (``wait()``, optionally ``is_completed()``).

            Raises:
                Whatever the backend's ``send``, ``recv`` and their works raise (from ``wait()``
                when ``async_op`` is true).
        """
        return self.reduce_scatter_v(output, input_list, op, async_op, timeout=timeout, hints=hints)

    def reduce_scatter_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Reduce chunk ``r`` of ``input`` over every rank into rank ``r``'s ``output``.

        Default: :meth:`reduce_scatter_v` over equal flat views of ``input`` (:func:`flat_chunks`).

        Args:
            output: this rank's result.
            input: ``get_size() * output.numel()`` elements.
            op: a reduction in :attr:`supported_reduce_ops`.
                async_op: return a work to wait on instead of completing before returning.
                timeout: the deadline for this call, already resolved by the core.
                hints: the call's hints merged with the communicator's.

            Returns:
                ``None`` once complete, or a work (``wait()``, optionally ``is_completed()``).

            Raises:
                Whatever the backend's ``send``, ``recv`` and their works raise (from ``wait()``
                when ``async_op`` is true).
        """
        n = self.get_size()
        blocks = flat_chunks(input, n)
        return self.reduce_scatter_v(output, blocks, op, async_op, timeout=timeout, hints=hints)

    def scatter(
        self,
        output_tensor: torch.Tensor,
        input_tensor_list: list[torch.Tensor],
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Send ``root``'s ``input_tensor_list[r]`` to rank ``r``'s ``output_tensor``.

        Default: ``root`` copies its own entry and sends the others in one :meth:`batch_op_issue`.

        Args:
            output_tensor: receives this rank's entry.
            input_tensor_list: on ``root``, one tensor per rank; ignored elsewhere.
            root: the rank that scatters.
                async_op: return a work to wait on instead of completing before returning.
                timeout: the deadline for this call, already resolved by the core.
                hints: the call's hints merged with the communicator's.

            Returns:
                ``None`` once complete, or a work (``wait()``, optionally ``is_completed()``).

            Raises:
                Whatever the backend's ``send``, ``recv`` and their works raise (from ``wait()``
                when ``async_op`` is true).
        """
        me, n = self.get_rank(), self.get_size()
        if me != root:
            return self.batch_op_issue(
                [("recv", output_tensor, root)], async_op, timeout=timeout, hints=hints
            )
        output_tensor.copy_(input_tensor_list[me])
        ops = [("send", input_tensor_list[p], p) for p in range(n) if p != me]
        return self.batch_op_issue(ops, async_op, timeout=timeout, hints=hints)

    def gather(
        self,
        output_tensor_list: list[torch.Tensor],
        input_tensor: torch.Tensor,
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Collect every rank's ``input_tensor`` into ``root``'s ``output_tensor_list``.

        Default: ranks other than ``root`` send, ``root`` receives in one :meth:`batch_op_issue`.

        Args:
            output_tensor_list: on ``root``, one tensor per rank (entry ``r`` receives rank
                ``r``'s); ignored elsewhere.
            input_tensor: this rank's contribution.
            root: the rank that gathers.
                async_op: return a work to wait on instead of completing before returning.
                timeout: the deadline for this call, already resolved by the core.
                hints: the call's hints merged with the communicator's.

            Returns:
                ``None`` once complete, or a work (``wait()``, optionally ``is_completed()``).

            Raises:
                Whatever the backend's ``send``, ``recv`` and their works raise (from ``wait()``
                when ``async_op`` is true).
        """
        me, n = self.get_rank(), self.get_size()
        if me != root:
            return self.batch_op_issue(
                [("send", input_tensor, root)], async_op, timeout=timeout, hints=hints
            )
        output_tensor_list[me].copy_(input_tensor)
        ops = [("recv", output_tensor_list[p], p) for p in range(n) if p != me]
        return self.batch_op_issue(ops, async_op, timeout=timeout, hints=hints)

    def gather_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Gather every rank's ``input`` into ``root``'s ``output``: rank ``r``'s in chunk ``r``.

        Default: :meth:`gather` into equal flat views of ``output``.

        Args:
            output: on ``root``, ``get_size() * input.numel()`` elements; ignored elsewhere.
            input: this rank's contribution.
            root: the rank that gathers.
                async_op: return a work to wait on instead of completing before returning.
                timeout: the deadline for this call, already resolved by the core.
                hints: the call's hints merged with the communicator's.

            Returns:
                ``None`` once complete, or a work (``wait()``, optionally ``is_completed()``).

            Raises:
                Whatever the backend's ``send``, ``recv`` and their works raise (from ``wait()``
                when ``async_op`` is true).
        """
        n = self.get_size()
        if self.get_rank() != root:
            return self.gather([], input.view(-1), root, async_op, timeout=timeout, hints=hints)
        chunks = flat_chunks(output, n)
        return self.gather(chunks, input.view(-1), root, async_op, timeout=timeout, hints=hints)

    def barrier(
        self,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Return (or complete the work) once every rank has entered the barrier.

        Default: an :meth:`all_reduce` of a one-element tensor on the communicator's device.

        Args:
            async_op: return a work to wait on instead of completing before returning.
            timeout: the deadline for this call, already resolved by the core.
            hints: the call's hints merged with the communicator's.

        Returns:
            ``None`` once complete, or a work (``wait()``, optionally ``is_completed()``).

        Raises:
            Whatever the backend's ``all_reduce`` raises (from ``wait()`` when ``async_op``).
        """
        token = torch.zeros(1, dtype=torch.float32, device=self.device)
        return self.all_reduce(token, ReduceOp.SUM, async_op, timeout=timeout, hints=hints)

    def split(self, ranks: list[int], name: str, options: CommOptions) -> TorchCommBackend | None:
        """Create the backend of a sub-communicator; ``options`` holds its store, rank, size.

        The default builds a fresh instance of the same class on the child's store.
        Non-members (``ranks == []``) get ``None``.
        """
        if not ranks:
            return None
        child = type(self)()
        child._bind(self.device, name, options)
        child.init(self.device, name, options)
        return child

    def abort(self) -> None:
        """Tear the engine down at once, abandoning operations in flight (optional)."""
        raise NotImplementedError(f"{type(self).__name__} does not support abort()")

    def reconfigure_engine(
        self, store: Any, rank: int, size: int, timeout: timedelta, options: CommOptions
    ) -> None:
        """Build a fresh engine as ``rank`` of ``size`` over ``store`` (optional).

        Called by ``TorchComm.reconfigure`` once every member is known to be present; the
        core has already aborted the previous engine and namespaced ``store`` by the uuid.
        Afterwards ``get_rank()``/``get_size()`` must return the new values.
        """
        raise RuntimeError(
            f"reconfigure not implemented by backend {type(self).__name__}; "
            f"use a backend whose method_support() reports reconfigure_engine"
        )

    def lean_calls(
        self, timeout: timedelta, hints: dict[str, str]
    ) -> dict[str, Callable[..., Any]]:
        """The backend's own entry points for the core's lean lane (optional; none here).

        Engines whose small collectives take a few microseconds (MPI) may return functions
        under any of these keys, which the core then calls in place of the method:

        - ``"all_reduce"``: ``fn(tensor, op)``
        - ``"broadcast"``: ``fn(tensor, root)``
        - ``"all_to_all_single"``: ``fn(output, input)``

        Each call means the method with ``async_op=False`` and the ``timeout`` and ``hints``
        given here (the communicator's defaults). The core calls them only with what its
        lean lane has checked: plain, contiguous, strided CPU tensors (not nested, not
        negated views) of a supported dtype; for ``all_reduce`` a reduction the backend
        declares native and valid for that dtype (never PREMUL_SUM); for ``broadcast`` a
        valid root; for ``all_to_all_single`` two tensors of one dtype and one shape whose
        dim 0 divides by the size (they may overlap). They return and raise what the method
        would. The core asks again whenever the communicator's state, hooks, default
        timeout or hints change.
        """
        return {}

    def new_window(self) -> Any:
        """Return a window engine (``torchcomms_core.spec.WindowEngine``) (optional).

        The core's ``TorchCommWindow`` does the checks and bookkeeping around it.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support windows")

    def recv_anysource(
        self,
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Receive into ``tensor`` from whichever rank sends to us first (optional).

        Always returns a work, even when ``async_op`` is false: its ``source_rank()``
        names the sender once ``wait()`` returned.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot receive from any source; pass the sender's rank"
        )

    def send_tagged(
        self,
        tensor: torch.Tensor,
        dst: int,
        tag: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Send ``tensor`` to ``dst`` under ``tag`` (optional; c10d's ``send(..., tag=)``).

        Only a receive from ``dst`` with the same tag matches it; messages with different
        tags between the same two ranks may be received in any order. A backend offering
        it also offers :meth:`recv_tagged`, and its :meth:`recv_anysource`, if any, takes
        a ``tag=`` keyword (passed only when nonzero). Tag 0 is the plain :meth:`send`'s.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot match messages by tag; send with tag=0"
        )

    def recv_tagged(
        self,
        tensor: torch.Tensor,
        src: int,
        tag: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Receive into ``tensor`` the message ``src`` sent under ``tag`` (optional)."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot match messages by tag; receive with tag=0"
        )


# -- helpers shared by the defaults, the core and backends ------------------------------


class MultiWork:
    """Completion handle over several works; ``wait()`` waits for all of them."""

    __slots__ = ("_works",)

    def __init__(self, works: list[Any]) -> None:
        self._works = works

    def wait(self) -> bool:
        """Wait for every work; return ``True``.

        Every work is waited on even when an earlier one failed, so none is left in flight.

        Raises:
            The first error a work raised, once all of them are settled.
        """
        first_error: BaseException | None = None
        for work in self._works:
            try:
                work.wait()
            except Exception as exc:  # keep waiting: every work must be settled
                if first_error is None:
                    first_error = exc
        if first_error is not None:
            raise first_error
        return True

    def is_completed(self) -> bool:
        """Whether every work reports completion; one without ``is_completed()`` counts as not."""
        return all(getattr(w, "is_completed", lambda: False)() for w in self._works)


class ThenWork:
    """Runs ``step`` after ``inner`` completes (a local post-processing stage)."""

    __slots__ = ("_inner", "_step", "_done")

    def __init__(self, inner: Any, step: Callable[[], None]) -> None:
        self._inner = inner
        self._step = step
        self._done = False

    def wait(self) -> bool:
        """Wait for ``inner``, then run ``step`` once (however often ``wait`` is called); ``True``.

        Raises:
            What ``inner.wait()`` or ``step`` raise; ``step`` does not run when ``inner`` failed.
        """
        if not self._done:
            self._inner.wait()
            self._step()
            self._done = True
        return True

    def is_completed(self) -> bool:
        """Whether ``step`` ran or ``inner`` reports completion (``wait()`` then runs ``step``)."""
        probe = getattr(self._inner, "is_completed", None)
        return self._done or (probe is not None and bool(probe()))


def then(work: Any, step: Callable[[], None]) -> Any:
    """Run ``step`` now if ``work`` is ``None`` (already done), else after it completes."""
    if work is None:
        step()
        return None
    return ThenWork(work, step)


def _settle(work: Any, async_op: bool) -> Any:
    if work is not None and not async_op:
        work.wait()
        return None
    return work


def flat_chunks(tensor: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``n`` equal flat views of ``tensor`` (empty views when it has no elements)."""
    flat = tensor.view(-1)
    if not flat.numel():
        return [flat] * n
    return list(flat.chunk(n))


def unflatten_into(flat: torch.Tensor, targets: Sequence[torch.Tensor]) -> Callable[[], None]:
    """A completion step copying consecutive pieces of ``flat`` back into ``targets``."""

    def step() -> None:
        offset = 0
        for t in targets:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n

    return step


def split_dim0(tensor: torch.Tensor, split_sizes: Sequence[int], n: int) -> list[torch.Tensor]:
    """Split ``tensor`` along dim 0 into ``n`` views (equal parts when ``split_sizes`` is empty)."""
    if tensor.dim() == 0:
        tensor = tensor.view(1)
    if not split_sizes:
        rows = tensor.shape[0] // n if n else 0
        split_sizes = [rows] * n
    return list(torch.split(tensor, list(split_sizes), dim=0))


def reduce_rows(rows: torch.Tensor, op_type: RedOpType) -> torch.Tensor:
    """Reduce the rows of a 2-D tensor in row order with a basic reduction."""
    acc = rows[0].clone()
    for i in range(1, rows.shape[0]):
        x = rows[i]
        if op_type is RedOpType.SUM:
            if acc.dtype == torch.bool:
                acc.logical_or_(x)
            else:
                acc.add_(x)
        elif op_type is RedOpType.PRODUCT:
            if acc.dtype == torch.bool:
                acc.logical_and_(x)
            else:
                acc.mul_(x)
        elif op_type is RedOpType.MIN:
            torch.minimum(acc, x, out=acc)
        elif op_type is RedOpType.MAX:
            torch.maximum(acc, x, out=acc)
        elif op_type is RedOpType.BAND:
            acc.bitwise_and_(x)
        elif op_type is RedOpType.BOR:
            acc.bitwise_or_(x)
        elif op_type is RedOpType.BXOR:
            acc.bitwise_xor_(x)
        else:
            raise ValueError(f"reduce_rows cannot apply {op_type!r}; the core resolves it first")
    return acc


def method_support(backend: type[TorchCommBackend] | TorchCommBackend) -> dict[str, str]:
    """Map each operation to ``"native"``, ``"derived"``, ``"unsupported"`` or ``"missing"``.

    ``"missing"``: a required method the class does not implement (such a class cannot be
    loaded; :func:`backend_class_problems` says why). The collectives that plugins add
    (``torchcomms.list_collectives()``) are listed too: ``"native"`` when the backend has a
    method of that name, else ``"derived"`` (the plugin's portable implementation).
    """
    cls = backend if isinstance(backend, type) else type(backend)
    report: dict[str, str] = {}
    missing = _abstract(cls)
    for name in REQUIRED_METHODS:
        report[name] = "missing" if name in missing else "native"
    for name in DERIVABLE_METHODS:
        report[name] = "native" if _overrides(cls, name) else "derived"
    for name in OPTIONAL_METHODS:
        report[name] = "native" if _overrides(cls, name) else "unsupported"
    if report["reconfigure_engine"] == "native" and not cls.reconfigure_support()[0]:
        report["reconfigure_engine"] = "unsupported"  # implemented, but not on this build
    for name in _collective_names():
        report.setdefault(name, "native" if callable(getattr(cls, name, None)) else "derived")
    return report


#: Names of the collectives plugins add (set by the plugin manager, which sits above the
#: spec: see ``set_collective_source``).
_collective_source: Callable[[], Sequence[str]] | None = None


def set_collective_source(source: Callable[[], Sequence[str]]) -> None:
    """Let :func:`method_support` list plugin collectives: ``source()`` names them."""
    global _collective_source
    _collective_source = source


def _collective_names() -> Sequence[str]:
    from torchcomms_core.foundation.errors import TorchCommError

    if _collective_source is None:
        return ()
    try:
        return _collective_source()
    except TorchCommError:  # a broken plugin set: reported where plugins are loaded
        return ()


def _abstract(cls: type) -> frozenset[str]:
    return frozenset(
        name
        for name in REQUIRED_METHODS
        if getattr(getattr(cls, name, None), "__isabstractmethod__", False)
        or not callable(getattr(cls, name, None))
    )


def method_signature(name: str) -> str:
    """How the core calls the spec method ``name``: ``"send(self, tensor, dst, ...)"``."""
    # Annotations are strings here (postponed evaluation): show them without quotes.
    return f"{name}{inspect.signature(getattr(TorchCommBackend, name))}".replace("'", "")


def backend_class_problems(cls: type[TorchCommBackend]) -> list[str]:
    """What keeps ``cls`` from working as a backend: each required method it lacks, and
    each spec method it defines with a signature the core cannot call. Empty when fine."""
    problems = []
    missing = _abstract(cls)
    if missing:
        names = ", ".join(n for n in REQUIRED_METHODS if n in missing)
        problems.append(
            f"missing required method(s) {names}: implement "
            + "; ".join(method_signature(n) for n in REQUIRED_METHODS if n in missing)
        )
    for name in (*REQUIRED_METHODS, *DERIVABLE_METHODS, *OPTIONAL_METHODS):
        if name in missing or not _overrides(cls, name):
            continue
        problem = _signature_problem(cls, name)
        if problem:
            problems.append(problem)
    return problems


def _signature_problem(cls: type, name: str) -> str | None:
    spec = inspect.signature(getattr(TorchCommBackend, name))
    params = list(spec.parameters.values())[1:]  # without self
    positional = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    required = [p for p in positional if p.default is p.empty]
    # ``timeout`` and ``hints`` may be left out: the core then calls without them (a
    # reference-style backend, see ``_calling``).
    keywords = {
        p.name: None
        for p in params
        if p.kind is p.KEYWORD_ONLY and p.name not in ("timeout", "hints")
    }
    static = inspect.getattr_static(cls, name)
    try:
        sig = inspect.signature(getattr(cls, name))
    except (TypeError, ValueError):  # not introspectable (a C function): trust it
        return None
    lead = () if isinstance(static, (staticmethod, classmethod)) else (None,)
    try:
        sig.bind(*lead, *[None] * len(positional), **keywords)
        sig.bind(*lead, *[None] * len(required))
    except TypeError as exc:
        return (
            f"{name}{sig} cannot be called as the core calls it ({exc}); the spec's "
            f"signature is {method_signature(name)}"
        )
    return None


def _overrides(cls: type, name: str) -> bool:
    return getattr(cls, name, None) is not getattr(TorchCommBackend, name)


def check_spec_version(declared: str, who: str) -> None:
    """Raise if a backend's declared spec version is incompatible with this core."""
    from torchcomms_core.foundation.errors import BackendLoadError

    try:
        major, minor = (int(p) for p in str(declared).split(".")[:2])
    except ValueError:
        raise BackendLoadError(
            f"{who} declares spec_version={declared!r}; expected 'MAJOR.MINOR' such as "
            f"{SPEC_VERSION!r}"
        ) from None
    core_major, core_minor = (int(p) for p in SPEC_VERSION.split("."))
    if major != core_major or minor > core_minor:
        hint = (
            "upgrade torchcomms-core"
            if (major, minor) > (core_major, core_minor)
            else "upgrade the backend plugin"
        )
        raise BackendLoadError(
            f"{who} targets backend spec {declared}, but this torchcomms-core implements "
            f"spec {SPEC_VERSION}; {hint} so that both agree"
        )

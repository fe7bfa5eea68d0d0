"""The backend contract: what a backend author implements, in one place.

A backend subclasses :class:`TorchCommBackend`, implements the required methods
(:data:`REQUIRED_METHODS`: lifecycle, ``send``, ``recv``) and registers the class under
the ``torchcomms.backends`` entry point. Every other operation (:data:`DERIVABLE_METHODS`)
already works through a portable default written against ``send``/``recv``, inherited
from :class:`~torchcomms_core.spec.defaults.PortableDefaults`; overriding one makes it
*native*. The capabilities of :data:`OPTIONAL_METHODS` have no default: they report
"unsupported" until a backend writes them. ``batch_op_issue`` receives its operations as
``BatchOp`` tuples ``("send" | "recv", tensor, peer)`` (defined beside the defaults).

**How the core calls an operation** (stated once here, for every operation):

- Positional arguments are the public API's, followed by ``async_op``; then keyword
  ``timeout`` (a ``timedelta``, already resolved by the core) and ``hints`` (the call's
  hints merged with the communicator's). A backend may leave ``timeout`` and ``hints`` out
  of its signature; the core then calls without them.
- The core has validated every argument, made tensors contiguous and resolved ``AVG``
  and ``PREMUL_SUM`` (unless the backend lists them in ``supported_reduce_ops``) before a
  backend sees them.
- Return ``None`` when the operation is complete, or an object with ``wait()``
  (optionally ``is_completed()``) while it is still running. With ``async_op=False``
  return only once done; with ``async_op=True`` do not block on the peers.
- Raise the engine's error, or have ``wait()`` raise it, when the operation fails or
  does not finish within ``timeout``; the core turns it into the user's error.

Imports: ``torch``, ``torchcomms_core.operations`` and ``spec.defaults``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from torchcomms_core.operations.reduce_op import RedOpType
from torchcomms_core.operations.table import DERIVED, names
from torchcomms_core.spec.defaults import PortableDefaults
from torchcomms_core.spec.tuning import OpAlgorithms, Tuning

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


def _name_of(backend: Any) -> str:
    try:
        return str(backend.get_backend_name())
    except Exception:  # not initialized yet
        return type(backend).__name__


class TorchCommBackend(PortableDefaults, abc.ABC):
    """Abstract backend. Subclass it, implement the required methods, register it.

    Every operation follows the calling contract of this module's docstring (``async_op``,
    ``timeout``, ``hints``; ``None`` or a work; the engine's errors).

    Derivable operations (``DERIVABLE_METHODS``: the rows of the operation table marked
    ``DERIVED``) each have a portable default (``PortableDefaults``, built on
    ``send``/``recv``); so does ``split`` (below: a fresh instance on the child's store).
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
    #: Whether ``TorchWork.wait_blocking()`` means something here: its works' ``wait()``
    #: only orders streams, and a ``wait_blocking()`` of theirs blocks the host (GPU
    #: engines). ``False`` (CPU backends, whose ``wait()`` already blocks the host):
    #: ``wait_blocking()`` raises ``RuntimeError``, as the reference's backends without it do.
    supports_wait_blocking: ClassVar[bool] = False
    #: The algorithms the backend has, per operation, with its default rules (#45): the
    #: backend asks ``self.tuning.choose(op, nbytes, dtype)`` which one to run
    #: (``spec.tuning``; docs/writing-a-tuner.md). Empty: nothing to choose.
    algorithms: ClassVar[Mapping[str, OpAlgorithms]] = {}

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
        if cls.reconfigure_engine is not TorchCommBackend.reconfigure_engine:
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
        given = getattr(options, "tuning", None)
        if isinstance(given, Tuning):
            given.adopt(self)
            self.tuning = given
        else:
            self.tuning = self.default_tuning(options)

    def default_tuning(self, options: Any = None) -> Tuning:
        """A :class:`Tuning` with the default rules only (no tuner): what a backend made
        outside ``new_comm``/``split`` (or one created for ``reconfigure``) chooses with."""
        cls = type(self)
        size = getattr(options, "size", 1) or 1
        return Tuning(
            self,
            cls.algorithms,
            backend=_name_of(self),
            world_size=max(int(size), 1),
            device=getattr(getattr(self, "device", None), "type", None) or cls.devices[0],
            hints=dict(getattr(options, "hints", None) or {}),
        )

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not set: a backend used without ``_bind`` (tests,
        # duck-typed callers) still gets a tuning that answers the default rules.
        if name == "tuning":
            tuning = self.default_tuning(self.__dict__.get("options"))
            self.tuning = tuning
            return tuning
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

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

    # -- the lean lane (optional) -----------------------------------------------------

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

    # -- optional capabilities (OPTIONAL_METHODS) -------------------------------------

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


# The derivable operations by name, as a vendor reading the class's help sees them.
TorchCommBackend.__doc__ = (
    f"{(TorchCommBackend.__doc__ or '').rstrip()}\n\n    Derivable: "
    + ", ".join(f"``{name}``" for name in DERIVABLE_METHODS)
    + ".\n"
)

"""``TorchComm`` and ``new_comm``: the communicator users hold.

Each operation validates its arguments, resolves what the backend lacks (non-contiguous
tensors, AVG, PREMUL_SUM), runs the hooks, calls the backend and returns a ``TorchWork``.
"""

from __future__ import annotations

import atexit
import itertools
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch

from . import _env
from ._batch import BatchSendRecv, P2POp
from ._bootstrap import default_store, resolve_rank_size
from ._calling import adapt_backend
from ._consistency import verify_call
from ._errors import (
    BackendLoadError,
    CommInputError,
    CommOperationError,
    CommStateError,
    CommTimeoutError,
    CommTypeError,
    TorchCommError,
)
from ._op_args import FINALIZE_OP_ID, OpName, args_class, next_op_id, op_name, post_args
from ._options import CommOptions
from ._plugins import call_lifecycle, failed_plugins, load_plugins
from ._reduce_op import RedOpType, ReduceOp
from ._registry import backend_version, get_backend_class, get_mem_allocator
from ._validation import Checker, check_hints, check_timeout, split_sizes, writable
from ._window import TorchCommWindow, create_window
from ._work import TorchWork, WorkStatus, is_engine_failure, is_timeout_error
from .spec import TorchCommBackend, method_support

_OK, _FINALIZED, _ABORTED, _FAILED = "ok", "finalized", "aborted", "failed"
_auto_names = itertools.count()
# Live communicators, released in order at interpreter exit: engines torn down during
# module teardown can abort the process (joinable C++ threads), so they go first.
_live: weakref.WeakSet[TorchComm] = weakref.WeakSet()


@atexit.register
def _release_live_at_exit() -> None:
    for comm in list(_live):
        try:
            comm._release_quietly()
        except Exception:  # exiting anyway; never turn a clean exit into a failure
            pass


class PersistentAllGather:
    """Handle of a persistent all-gather: the bound output tensor."""

    __slots__ = ("comm", "output")

    def __init__(self, comm: TorchComm, output: torch.Tensor) -> None:
        self.comm = comm
        self.output: torch.Tensor | None = output


class RemovableHandle:
    """Returned by ``register_*_hook``; ``remove()`` unregisters the hook."""

    __slots__ = ("_table", "_key")
    _ids = itertools.count()

    def __init__(self, table: dict[int, Callable[..., Any]], fn: Callable[..., Any]) -> None:
        self._table = table
        self._key = next(self._ids)
        table[self._key] = fn

    def remove(self) -> None:
        self._table.pop(self._key, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _contiguous_in(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _release_dropped(backend: TorchCommBackend, name: str) -> None:
    warnings.warn(
        f"torchcomms communicator {name!r} was garbage-collected without finalize(); its "
        f"resources were released. Call comm.finalize() when you are done with it",
        ResourceWarning,
        stacklevel=2,
    )
    try:
        backend.finalize()
    except Exception:  # the engine may already be broken; never fail in a finalizer
        pass


class TorchComm:
    """An eagerly initialised communicator over one backend and one device."""

    def __init__(self, backend: TorchCommBackend, device: torch.device, name: str,
                 options: CommOptions, store: Any, backend_name: str | None = None) -> None:
        adapt_backend(backend)  # reference-style methods without timeout=/hints=
        self._backend = backend
        self._backend_name = backend_name or backend.get_backend_name()
        self._device = device
        self._name = name
        self._options = options
        self._store = store
        self._rank = backend.get_rank()
        self._size = backend.get_size()
        self._timeout: timedelta = options.timeout or _env.default_timeout()
        self._hints: dict[str, str] = dict(options.hints)
        self._state = _OK
        self._failure: BaseException | None = None
        self._pre_hooks: dict[int, Callable[..., Any]] = {}
        self._post_hooks: dict[int, Callable[..., Any]] = {}
        self._abort_hooks: dict[int, Callable[..., Any]] = {}
        self._lock = threading.Lock()
        # Async works not yet waited on; at exit a communicator with any is aborted rather
        # than finalized, so exit never waits for a peer that will not come.
        self._inflight: weakref.WeakSet[TorchWork] = weakref.WeakSet()
        cls = type(backend)
        self._native_ops = frozenset(cls.supported_reduce_ops)
        self._check = Checker(name, device, self._rank, self._size, cls.supported_dtypes,
                              self._native_ops)
        self._support = method_support(cls)
        self._check_calls = _env.check_collectives()
        self._finalizer = weakref.finalize(self, _release_dropped, backend, name)
        self._finalizer.atexit = False
        _live.add(self)

    # -- identity --------------------------------------------------------------------

    def get_rank(self) -> int:
        return self._rank

    def get_size(self) -> int:
        return self._size

    def get_name(self) -> str:
        return self._name

    def get_device(self) -> torch.device:
        return self._device

    def get_backend(self) -> str:
        """The backend name given to ``new_comm`` (``"gloo"``, ``"nccl"``, ...)."""
        return self._backend_name

    def get_backend_version(self) -> str:
        """The version of the backend: its distribution's, else the engine's."""
        return backend_version(type(self._backend))

    def get_mem_allocator(self) -> Any:
        """The backend's process-wide memory allocator (``get_mem_allocator(backend)``)."""
        return get_mem_allocator(self._backend_name)

    @property
    def mem_allocator(self) -> Any:
        """Deprecated alias of :meth:`get_mem_allocator`."""
        warnings.warn("TorchComm.mem_allocator is deprecated; call get_mem_allocator()",
                      DeprecationWarning, stacklevel=2)
        return self.get_mem_allocator()

    def tensor_register(self, tensor: torch.Tensor) -> None:
        """Pre-register ``tensor``'s memory with the backend (a no-op where it has none)."""
        self._check.tensor("tensor_register", "tensor", tensor)
        register = getattr(self._backend, "tensor_register", None)
        if register is not None:
            register(tensor)

    def tensor_deregister(self, tensor: torch.Tensor) -> None:
        """Release a registration made by :meth:`tensor_register`."""
        self._check.tensor("tensor_deregister", "tensor", tensor)
        deregister = getattr(self._backend, "tensor_deregister", None)
        if deregister is not None:
            deregister(tensor)

    def get_device_transport(self) -> int:
        """The backend's device transport handle; only GPU backends have one."""
        transport = getattr(self._backend, "get_device_transport", None)
        if transport is None:
            raise CommStateError(
                f"get_device_transport: backend {self._backend_name!r} has no device "
                f"transport (it is a GPU-backend feature of the reference's ncclx); use the "
                f"communicator's operations or windows instead"
            )
        return int(transport())

    def __copy__(self) -> TorchComm:
        return self  # a communicator is a live endpoint: copies are the same object

    def __deepcopy__(self, memo: dict[int, Any]) -> TorchComm:
        memo[id(self)] = self
        return self

    def get_options(self) -> CommOptions:
        return self._options

    @property
    def checker(self) -> Checker:
        """The argument checker of this communicator (for plugin collectives).

        ``comm.checker.tensor(op, arg, t)``, ``.tensor_list``, ``.peer``, ``.same_dtype``,
        ``.numel`` and ``.reduce_op`` raise the same errors as the built-in operations.
        """
        return self._check

    def get_backend_impl(self) -> TorchCommBackend:
        """The backend object (a ``TorchCommBackend``)."""
        return self._backend

    def unsafe_get_backend(self) -> TorchCommBackend:
        """Deprecated alias of :meth:`get_backend_impl` (the engine is ``.engine`` on it)."""
        warnings.warn("TorchComm.unsafe_get_backend() is deprecated; use get_backend_impl()",
                      DeprecationWarning, stacklevel=2)
        return self._backend

    def method_support(self) -> dict[str, str]:
        """Which operations the backend runs natively and which the core derives."""
        return dict(self._support)

    def get_timeout(self) -> timedelta:
        return self._timeout

    def set_timeout(self, timeout: timedelta) -> None:
        """Set the default timeout of every later operation."""
        self._timeout = check_timeout(timeout, "set_timeout")
        self._options.timeout = self._timeout
        self._backend.set_timeout(self._timeout)

    def set_hints(self, hints: dict[str, str]) -> None:
        self._hints = dict(check_hints(hints, "set_hints"))

    def __getattr__(self, item: str) -> Any:
        # Only reached for unknown attributes: plugin collectives are installed on the
        # class when plugins load, so load them once and look again.
        if item.startswith("_"):
            raise AttributeError(item)
        load_plugins()
        if item in type(self).__dict__:
            return getattr(self, item)
        failed = failed_plugins()
        hint = ("; plugins that failed to load: " + "; ".join(r.error for r in failed)
                if failed else "; torchcomms.list_collectives() lists what is available")
        raise AttributeError(f"TorchComm has no attribute {item!r}{hint}")

    def __repr__(self) -> str:
        return (f"<TorchComm {self._name!r} backend={self.get_backend()} rank={self._rank}/"
                f"{self._size} device={self._device} {self._state}>")

    # -- lifecycle -------------------------------------------------------------------

    def finalize(self) -> None:
        """Release the communicator after its operations complete. Idempotent and thread-safe.

        Every later operation raises :class:`CommStateError`. Operations still in flight are
        waited for (each up to its timeout); use :meth:`abort` to abandon them instead.
        """
        with self._lock:
            if self._state is _FINALIZED or self._state is _ABORTED:
                return
            self._state = _FINALIZED
        self._finalizer.detach()
        try:
            hook_args = self._pre_plain("finalize", (), FINALIZE_OP_ID)
        finally:  # a failing hook must not leave the engine running
            self._backend.finalize()
        self._post_plain(hook_args)
        call_lifecycle("torchcomms_comm_finalized", comm=self)

    def _release_quietly(self) -> None:
        """Release at interpreter exit: finalize, or abort when operations are in flight."""
        if any(w._status is WorkStatus.INPROGRESS and not w._engine_done()
               for w in list(self._inflight)):
            self.abort()
            return
        with self._lock:
            if self._state is not _OK and self._state is not _FAILED:
                return
            self._state = _FINALIZED
        self._finalizer.detach()
        self._backend.finalize()

    def abort(self) -> None:
        """Tear the communicator down now, abandoning operations in flight; runs abort hooks.

        Returns without waiting for peers. Works still in flight raise
        :class:`CommStateError` from ``wait()``. Idempotent and thread-safe.
        """
        with self._lock:
            if self._state is _FINALIZED or self._state is _ABORTED:
                return
            self._state = _ABORTED
        self._finalizer.detach()
        self._run_abort_hooks()
        if self.is_abort_supported():
            self._backend.abort()
        else:
            self._backend.finalize()
        call_lifecycle("torchcomms_comm_aborted", comm=self, reason="abort")

    def is_aborted(self) -> bool:
        return self._state is _ABORTED

    def is_finalized(self) -> bool:
        return self._state is _FINALIZED

    def is_abort_supported(self) -> bool:
        return self._support.get("abort") == "native"

    def get_init_handle(self) -> str:
        """An opaque handle naming this rank's endpoint of the communicator."""
        handle = getattr(self, "_init_handle", None)
        if handle is not None:  # enable_reconfigure: the token reconfigure expects
            return handle
        return f"{self.get_backend()}://{self._name}/{self._rank}"

    def reconfigure(self, uuid: int | str, init_handles: list[str] | set[str],
                    timeout: timedelta | None = None,
                    hints: dict[str, str] | None = None) -> TorchWork:
        """Bind the communicator to exactly the members ``init_handles`` names (fault tolerance).

        Rank is the caller's position in the list (sorted order for a set), size its length;
        ``uuid`` must be new for this communicator. Completed on return. See
        ``torchcomms_core._reconfigure`` and docs/fault-tolerance.md.
        """
        from ._reconfigure import reconfigure

        return reconfigure(self, uuid, init_handles, timeout, hints)

    def _ensure_usable(self, op: str) -> None:
        state = self._state
        if state == "unbound":
            from ._reconfigure import unbound_error

            raise unbound_error(op, self._name)
        if state is _FINALIZED:
            raise CommStateError(
                f"{op}: communicator {self._name!r} was finalized; create a new one with "
                f"torchcomms.new_comm()"
            )
        if state is _ABORTED:
            raise CommStateError(
                f"{op}: communicator {self._name!r} was aborted; create a new one with "
                f"torchcomms.new_comm()"
            )
        raise CommStateError(
            f"{op}: communicator {self._name!r} failed earlier ({self._failure}) and cannot run "
            f"more operations; finalize it and create a new communicator"
        ) from self._failure

    def _on_work_failure(self, work: TorchWork, error: BaseException) -> None:
        with self._lock:
            if self._state is not _OK:
                return
            self._state = _FAILED
            self._failure = error
        self._run_abort_hooks()
        call_lifecycle("torchcomms_comm_aborted", comm=self, reason=str(error))
        # With enable_reconfigure a failure revokes the communicator; recovery is reconfigure.
        if (self._options.abort_process_on_timeout_or_error
                and not self._options.enable_reconfigure):
            sys.stderr.write(
                f"torchcomms: aborting the process: {error} "
                f"(abort_process_on_timeout_or_error=True)\n"
            )
            sys.stderr.flush()
            os.abort()

    def _run_abort_hooks(self) -> None:
        for hook in tuple(self._abort_hooks.values()):
            try:
                hook()
            except Exception as exc:  # an abort hook must not mask the original failure
                warnings.warn(f"torchcomms abort hook {hook!r} raised {exc!r}", RuntimeWarning,
                              stacklevel=2)

    # -- hooks -----------------------------------------------------------------------

    def register_pre_hook(self, callback: Callable[[OpName, int, Any], None]
                          ) -> RemovableHandle:
        """Call ``callback(name, op_id, args)`` before each operation is issued.

        ``args`` is the operation's ``<Op>PreHookArgs``; ``args.work`` is its
        ``TorchWork`` (status ``NOT_STARTED``). Returns a handle whose ``remove()``
        unregisters the hook.
        """
        return RemovableHandle(self._pre_hooks, _callable(callback, "register_pre_hook"))

    def register_post_hook(self, callback: Callable[[int, Any], None]) -> RemovableHandle:
        """Call ``callback(op_id, args)`` after each operation is issued.

        ``args`` is a ``CollectivePostHookArgs`` (``SplitPostHookArgs``, ...) with the
        operation's ``work``; synchronous operations have completed by then.
        """
        return RemovableHandle(self._post_hooks, _callable(callback, "register_post_hook"))

    def register_abort_hook(self, callback: Callable[[], None]) -> RemovableHandle:
        """Call ``callback()`` when the communicator aborts or an operation fails or times out."""
        return RemovableHandle(self._abort_hooks, _callable(callback, "register_abort_hook"))

    # -- the engine room -------------------------------------------------------------

    def _issue(self, name: str, method: Callable[..., Any], bargs: tuple[Any, ...],
               async_op: bool, timeout: timedelta | None, hints: dict[str, str] | None,
               finishers: list[Callable[[], None]] | None, hook_values: tuple[Any, ...],
               extra: dict[str, Any] | None = None) -> TorchWork:
        args = None
        if self._pre_hooks or self._post_hooks:
            op_id = next_op_id()
            args = args_class(name)(name, op_id, hook_values, async_op, timeout, hints)
            # Pre-hooks see the operation's work before it starts (status NOT_STARTED).
            args.work = TorchWork.not_started(self, name)
            label = op_name(name)
            for hook in tuple(self._pre_hooks.values()):
                hook(label, op_id, args)
        if timeout is None:
            timeout = self._timeout
        if hints is None:
            hints = self._hints
        try:
            if self._check_calls:
                verify_call(self._backend, name, hook_values, self._size, timeout)
            if extra:
                inner = method(*bargs, async_op, timeout=timeout, hints=hints, **extra)
            else:
                inner = method(*bargs, async_op, timeout=timeout, hints=hints)
        except Exception as exc:
            if not is_engine_failure(exc):
                raise  # refused by the backend's own checks: the communicator is fine
            # Failed while issuing (sync calls wait inside the backend): classify it and
            # update the communicator exactly as a failed wait() would.
            error = TorchWork.failed(exc, self, name).error
            if error is exc:
                raise
            raise error from exc  # type: ignore[misc]
        if args is None:
            work = TorchWork(inner, finishers, self, name)
        else:
            work = args.work
            work._start(inner, finishers)
        if not async_op and (inner is not None or finishers):
            work.wait()
        elif async_op and work._status is WorkStatus.INPROGRESS:
            self._inflight.add(work)
        if args is not None:
            post = post_args(args, work)
            for hook in tuple(self._post_hooks.values()):
                hook(args.op_id, post)
        return work

    def _begin(self, op: str, timeout: Any, hints: Any
               ) -> tuple[timedelta | None, dict[str, str] | None]:
        """Refuse calls on an unusable communicator and check per-call timeout and hints.

        Runs first in every operation, so a bad value never reaches the engine and never
        changes the communicator's state.
        """
        if self._state is not _OK:
            self._ensure_usable(op)
        if timeout is not None:
            timeout = check_timeout(timeout, op)
        if hints is not None:
            hints = check_hints(hints, op)
        return timeout, hints

    def _inout(self, t: torch.Tensor, finishers: list[Callable[[], None]], op: str
               ) -> torch.Tensor:
        """A contiguous stand-in for an in-place tensor, copied back on completion."""
        if t.is_contiguous():
            return t
        writable(op, t)
        tmp = t.contiguous()
        finishers.append(lambda: t.copy_(tmp))
        return tmp

    def _out(self, t: torch.Tensor, finishers: list[Callable[[], None]], op: str
             ) -> torch.Tensor:
        """A contiguous stand-in for an output tensor, copied back on completion."""
        if t.is_contiguous():
            return t
        writable(op, t)
        tmp = torch.empty_like(t, memory_format=torch.contiguous_format)
        finishers.append(lambda: t.copy_(tmp))
        return tmp

    def _resolve_op(self, op: ReduceOp, out: torch.Tensor, finishers: list[Callable[[], None]],
                    divide: bool = True) -> ReduceOp:
        """Map AVG/PREMUL_SUM onto SUM when the backend lacks them; the caller pre-scales."""
        t = op.type
        if t in self._native_ops:
            return op
        if t is RedOpType.AVG:
            if divide:
                size = self._size
                finishers.insert(0, lambda: out.div_(size))
            return ReduceOp.SUM
        return ReduceOp.SUM  # PREMUL_SUM: the caller multiplied the inputs by the factor

    @staticmethod
    def _premul(op: ReduceOp) -> Any:
        if op.type is RedOpType.PREMUL_SUM:
            return op.factor
        return None

    def _scaled(self, t: torch.Tensor, op: ReduceOp) -> torch.Tensor:
        factor = self._premul(op) if op.type not in self._native_ops else None
        if factor is None:
            return t
        return t * factor

    # -- point to point --------------------------------------------------------------

    def send(self, tensor: torch.Tensor, dst: int, async_op: bool = False,
             hints: dict[str, str] | None = None,
             timeout: timedelta | None = None) -> TorchWork:
        timeout, hints = self._begin("send", timeout, hints)
        c = self._check
        c.tensor("send", "tensor", tensor)
        dst = c.peer("send", "dst", dst, allow_self=False)
        b = self._backend
        return self._issue("send", b.send, (_contiguous_in(tensor), dst), async_op, timeout,
                           hints, None, (tensor, dst))

    def recv(self, tensor: torch.Tensor, src: int, async_op: bool = False,
             hints: dict[str, str] | None = None,
             timeout: timedelta | None = None) -> TorchWork:
        timeout, hints = self._begin("recv", timeout, hints)
        c = self._check
        c.tensor("recv", "tensor", tensor)
        src = c.peer("recv", "src", src, allow_self=False)
        fin: list[Callable[[], None]] = []
        buf = self._out(tensor, fin, "recv")
        return self._issue("recv", self._backend.recv, (buf, src), async_op, timeout, hints,
                           fin or None, (tensor, src))

    def batch_op_create(self) -> BatchSendRecv:
        """Start a batch of sends and receives, issued together by ``issue()``."""
        if self._state is not _OK:
            self._ensure_usable("batch_op_create")
        return BatchSendRecv(self)

    def _batch_issue(self, ops: list[Any], async_op: bool, timeout: timedelta | None,
                     hints: dict[str, str] | None) -> TorchWork:
        timeout, hints = self._begin("batch_op_issue", timeout, hints)
        c = self._check
        for i, op in enumerate(ops):  # ``batch.ops`` is writable: check what it holds now
            if not isinstance(op, P2POp):
                raise CommTypeError(f"batch_op_issue: ops[{i}] must be a torchcomms.P2POp, got "
                                    f"{type(op).__name__}")
            c.tensor("batch_op_issue", f"ops[{i}].tensor", op.tensor)
            c.peer("batch_op_issue", f"ops[{i}].peer", op.peer, allow_self=False)
        fin: list[Callable[[], None]] = []
        prepared = []
        for kind, tensor, peer in ops:
            if kind == "send":
                prepared.append((kind, _contiguous_in(tensor), peer))
            else:
                prepared.append((kind, self._out(tensor, fin, "batch_op_issue"), peer))
        if not prepared:
            return TorchWork(None, None, self, "batch_op_issue")
        return self._issue("batch_op_issue", self._backend.batch_op_issue, (prepared,),
                           async_op, timeout, hints, fin or None, (list(ops),))

    # -- collectives -----------------------------------------------------------------

    def broadcast(self, tensor: torch.Tensor, root: int, async_op: bool = False,
                  hints: dict[str, str] | None = None,
                  timeout: timedelta | None = None) -> TorchWork:
        timeout, hints = self._begin("broadcast", timeout, hints)
        c = self._check
        c.tensor("broadcast", "tensor", tensor)
        root = c.peer("broadcast", "root", root)
        fin: list[Callable[[], None]] = []
        buf = self._inout(tensor, fin, "broadcast")
        return self._issue("broadcast", self._backend.broadcast, (buf, root), async_op, timeout,
                           hints, fin or None, (tensor, root))

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, async_op: bool = False,
                   hints: dict[str, str] | None = None,
                   timeout: timedelta | None = None) -> TorchWork:
        timeout, hints = self._begin("all_reduce", timeout, hints)
        c = self._check
        c.tensor("all_reduce", "tensor", tensor)
        red = c.reduce_op("all_reduce", op, tensor.dtype)
        if red._type in self._native_ops and tensor.is_contiguous():
            # The common case, kept lean: nothing to prepare or finish.
            return self._issue("all_reduce", self._backend.all_reduce, (tensor, red), async_op,
                               timeout, hints, None, (tensor, red))
        fin: list[Callable[[], None]] = []
        buf = self._inout(tensor, fin, "all_reduce")
        if red.type not in self._native_ops:
            factor = self._premul(red)
            if factor is not None:
                buf.mul_(factor)
            bop = self._resolve_op(red, buf, fin)
        else:
            bop = red
        return self._issue("all_reduce", self._backend.all_reduce, (buf, bop), async_op,
                           timeout, hints, fin or None, (tensor, red))

    def reduce(self, tensor: torch.Tensor, root: int, op: ReduceOp, async_op: bool = False,
               hints: dict[str, str] | None = None,
               timeout: timedelta | None = None) -> TorchWork:
        timeout, hints = self._begin("reduce", timeout, hints)
        c = self._check
        c.tensor("reduce", "tensor", tensor)
        root = c.peer("reduce", "root", root)
        red = c.reduce_op("reduce", op, tensor.dtype)
        fin: list[Callable[[], None]] = []
        is_root = self._rank == root
        buf = self._inout(tensor, fin, "reduce") if is_root else _contiguous_in(tensor)
        bop = red
        if red.type not in self._native_ops:
            factor = self._premul(red)
            if factor is not None:
                buf = buf.mul_(factor) if is_root else buf * factor
            bop = self._resolve_op(red, buf, fin, divide=is_root)
        return self._issue("reduce", self._backend.reduce, (buf, root, bop), async_op, timeout,
                           hints, fin or None, (tensor, root, red))

    def all_gather(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor,
                   async_op: bool = False, hints: dict[str, str] | None = None,
                   timeout: timedelta | None = None) -> TorchWork:
        timeout, hints = self._begin("all_gather", timeout, hints)
        c = self._check
        c.tensor("all_gather", "tensor", tensor)
        outs = c.tensor_list("all_gather", "tensor_list", tensor_list, self._size)
        for i, t in enumerate(outs):
            c.same_dtype("all_gather", f"tensor_list[{i}]", t, "tensor", tensor)
            c.numel("all_gather", f"tensor_list[{i}]", t, tensor.numel(),
                    "the same as the input tensor")
        fin: list[Callable[[], None]] = []
        bufs = [self._out(t, fin, "all_gather") for t in outs]
        return self._issue("all_gather", self._backend.all_gather,
                           (bufs, _contiguous_in(tensor)), async_op, timeout, hints, fin or None,
                           (tensor_list, tensor))

    def all_gather_v(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor,
                     async_op: bool = False, hints: dict[str, str] | None = None,
                     timeout: timedelta | None = None) -> TorchWork:
        timeout, hints = self._begin("all_gather_v", timeout, hints)
        c = self._check
        c.tensor("all_gather_v", "tensor", tensor)
        outs = c.tensor_list("all_gather_v", "tensor_list", tensor_list, self._size)
        for i, t in enumerate(outs):
            c.same_dtype("all_gather_v", f"tensor_list[{i}]", t, "tensor", tensor)
        c.numel("all_gather_v", f"tensor_list[{self._rank}]", outs[self._rank], tensor.numel(),
                "this rank's own entry receives its input tensor")
        fin: list[Callable[[], None]] = []
        bufs = [self._out(t, fin, "all_gather_v") for t in outs]
        return self._issue("all_gather_v", self._backend.all_gather_v,
                           (bufs, _contiguous_in(tensor)), async_op, timeout, hints, fin or None,
                           (tensor_list, tensor))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          async_op: bool = False, hints: dict[str, str] | None = None,
                          timeout: timedelta | None = None) -> TorchWork:
        timeout, hints = self._begin("all_gather_single", timeout, hints)
        c = self._check
        c.tensor("all_gather_single", "output", output)
        c.tensor("all_gather_single", "input", input)
        c.same_dtype("all_gather_single", "output", output, "input", input)
        c.numel("all_gather_single", "output", output, input.numel() * self._size,
                f"input.numel() * size = {input.numel()} * {self._size}")
        fin: list[Callable[[], None]] = []
        out = self._out(output, fin, "all_gather_single")
        return self._issue("all_gather_single", self._backend.all_gather_single,
                           (out, _contiguous_in(input)), async_op, timeout, hints, fin or None,
                           (output, input))

    def reduce_scatter(self, output: torch.Tensor, input_list: list[torch.Tensor],
                       op: ReduceOp, async_op: bool = False,
                       hints: dict[str, str] | None = None,
                       timeout: timedelta | None = None) -> TorchWork:
        return self._reduce_scatter_lists("reduce_scatter", self._backend.reduce_scatter, output,
                                          input_list, op, async_op, hints, timeout, True)

    def reduce_scatter_v(self, output: torch.Tensor, input_list: list[torch.Tensor],
                         op: ReduceOp, async_op: bool = False,
                         hints: dict[str, str] | None = None,
                         timeout: timedelta | None = None) -> TorchWork:
        return self._reduce_scatter_lists("reduce_scatter_v", self._backend.reduce_scatter_v,
                                          output, input_list, op, async_op, hints, timeout, False)

    def _reduce_scatter_lists(self, name: str, method: Callable[..., Any], output: torch.Tensor,
                              input_list: list[torch.Tensor], op: ReduceOp, async_op: bool,
                              hints: dict[str, str] | None, timeout: timedelta | None,
                              uniform: bool) -> TorchWork:
        timeout, hints = self._begin(name, timeout, hints)
        c = self._check
        c.tensor(name, "output", output)
        ins = c.tensor_list(name, "input_list", input_list, self._size)
        for i, t in enumerate(ins):
            c.same_dtype(name, f"input_list[{i}]", t, "output", output)
            if uniform or i == self._rank:
                c.numel(name, f"input_list[{i}]", t, output.numel(),
                        "the same as the output tensor")
        red = c.reduce_op(name, op, output.dtype)
        fin: list[Callable[[], None]] = []
        out = self._out(output, fin, name)
        bins = [self._scaled(_contiguous_in(t), red) for t in ins]
        bop = self._resolve_op(red, out, fin)
        return self._issue(name, method, (out, bins, bop), async_op, timeout, hints,
                           fin or None, (output, input_list, red))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, op: ReduceOp,
                              async_op: bool = False, hints: dict[str, str] | None = None,
                              timeout: timedelta | None = None) -> TorchWork:
        timeout, hints = self._begin("reduce_scatter_single", timeout, hints)
        c = self._check
        c.tensor("reduce_scatter_single", "output", output)
        c.tensor("reduce_scatter_single", "input", input)
        c.same_dtype("reduce_scatter_single", "output", output, "input", input)
        c.numel("reduce_scatter_single", "input", input, output.numel() * self._size,
                f"output.numel() * size = {output.numel()} * {self._size}")
        red = c.reduce_op("reduce_scatter_single", op, output.dtype)
        fin: list[Callable[[], None]] = []
        out = self._out(output, fin, "reduce_scatter_single")
        bin_ = self._scaled(_contiguous_in(input), red)
        bop = self._resolve_op(red, out, fin)
        return self._issue("reduce_scatter_single", self._backend.reduce_scatter_single,
                           (out, bin_, bop), async_op, timeout, hints, fin or None,
                           (output, input, red))

    def all_to_all(self, output_tensor_list: list[torch.Tensor],
                   input_tensor_list: list[torch.Tensor], async_op: bool = False,
                   hints: dict[str, str] | None = None,
                   timeout: timedelta | None = None) -> TorchWork:
        timeout, hints = self._begin("all_to_all", timeout, hints)
        c = self._check
        outs = c.tensor_list("all_to_all", "output_tensor_list", output_tensor_list, self._size)
        ins = c.tensor_list("all_to_all", "input_tensor_list", input_tensor_list, self._size)
        for i in range(self._size):
            c.same_dtype("all_to_all", f"output_tensor_list[{i}]", outs[i],
                         "input_tensor_list[0]", ins[0])
            c.same_dtype("all_to_all", f"input_tensor_list[{i}]", ins[i],
                         "input_tensor_list[0]", ins[0])
        me = self._rank
        c.numel("all_to_all", f"output_tensor_list[{me}]", outs[me], ins[me].numel(),
                f"this rank sends input_tensor_list[{me}] to itself")
        fin: list[Callable[[], None]] = []
        bouts = [self._out(t, fin, "all_to_all") for t in outs]
        bins = [_contiguous_in(t) for t in ins]
        return self._issue("all_to_all", self._backend.all_to_all, (bouts, bins), async_op,
                           timeout, hints, fin or None, (output_tensor_list, input_tensor_list))

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          async_op: bool = False, hints: dict[str, str] | None = None,
                          timeout: timedelta | None = None) -> TorchWork:
        timeout, hints = self._begin("all_to_all_single", timeout, hints)
        c = self._check
        c.tensor("all_to_all_single", "output", output)
        c.tensor("all_to_all_single", "input", input)
        c.same_dtype("all_to_all_single", "output", output, "input", input)
        c.numel("all_to_all_single", "output", output, input.numel(),
                "the same as the input")
        rows = input.shape[0] if input.dim() else 1
        if rows % self._size:
            raise CommInputError(
                f"all_to_all_single: input dim 0 ({rows}) must be divisible by the communicator "
                f"size {self._size}; use all_to_all_v_single for uneven splits"
            )
        fin: list[Callable[[], None]] = []
        out = self._out(output, fin, "all_to_all_single")
        return self._issue("all_to_all_single", self._backend.all_to_all_single,
                           (out, _contiguous_in(input)), async_op, timeout, hints, fin or None,
                           (output, input))

    def all_to_all_v_single(self, output: torch.Tensor, input: torch.Tensor,
                            output_split_sizes: Sequence[int], input_split_sizes: Sequence[int],
                            async_op: bool = False, hints: dict[str, str] | None = None,
                            timeout: timedelta | None = None) -> TorchWork:
        timeout, hints = self._begin("all_to_all_v_single", timeout, hints)
        op = "all_to_all_v_single"
        c = self._check
        c.tensor(op, "output", output)
        c.tensor(op, "input", input)
        c.same_dtype(op, "output", output, "input", input)
        if input.dim() == 0 or output.dim() == 0:
            raise CommInputError(f"{op}: input and output need at least one dimension to split")
        if output.shape[1:] != input.shape[1:]:
            raise CommInputError(
                f"{op}: output rows have shape {tuple(output.shape[1:])} but input rows have "
                f"{tuple(input.shape[1:])}; all dimensions but the first must match"
            )
        n = self._size
        osz = split_sizes(op, "output_split_sizes", output_split_sizes, n, output.shape[0])
        isz = split_sizes(op, "input_split_sizes", input_split_sizes, n, input.shape[0])
        me = self._rank
        if osz[me] != isz[me]:
            raise CommInputError(
                f"{op}: output_split_sizes[{me}]={osz[me]} must equal input_split_sizes[{me}]="
                f"{isz[me]} (this rank's block to itself)"
            )
        fin: list[Callable[[], None]] = []
        out = self._out(output, fin, "all_to_all_v_single")
        return self._issue(op, self._backend.all_to_all_v_single,
                           (out, _contiguous_in(input), osz, isz), async_op, timeout, hints,
                           fin or None, (output, input, list(osz), list(isz)))

    def barrier(self, async_op: bool = False, hints: dict[str, str] | None = None,
                timeout: timedelta | None = None) -> TorchWork:
        timeout, hints = self._begin("barrier", timeout, hints)
        return self._issue("barrier", self._backend.barrier, (), async_op, timeout, hints, None,
                           ())

    def scatter(self, output_tensor: torch.Tensor, input_tensor_list: list[torch.Tensor],
                root: int, async_op: bool = False, hints: dict[str, str] | None = None,
                timeout: timedelta | None = None) -> TorchWork:
        timeout, hints = self._begin("scatter", timeout, hints)
        c = self._check
        c.tensor("scatter", "output_tensor", output_tensor)
        root = c.peer("scatter", "root", root)
        bins: list[torch.Tensor] = []
        if self._rank == root:
            ins = c.tensor_list("scatter", "input_tensor_list", input_tensor_list, self._size)
            for i, t in enumerate(ins):
                c.same_dtype("scatter", f"input_tensor_list[{i}]", t, "output_tensor",
                             output_tensor)
                c.numel("scatter", f"input_tensor_list[{i}]", t, output_tensor.numel(),
                        "the same as output_tensor")
            bins = [_contiguous_in(t) for t in ins]
        fin: list[Callable[[], None]] = []
        out = self._out(output_tensor, fin, "scatter")
        return self._issue("scatter", self._backend.scatter, (out, bins, root), async_op,
                           timeout, hints, fin or None, (output_tensor, input_tensor_list, root))

    def gather(self, output_tensor_list: list[torch.Tensor], input_tensor: torch.Tensor,
               root: int, async_op: bool = False, hints: dict[str, str] | None = None,
               timeout: timedelta | None = None) -> TorchWork:
        timeout, hints = self._begin("gather", timeout, hints)
        c = self._check
        c.tensor("gather", "input_tensor", input_tensor)
        root = c.peer("gather", "root", root)
        fin: list[Callable[[], None]] = []
        bouts: list[torch.Tensor] = []
        if self._rank == root:
            outs = c.tensor_list("gather", "output_tensor_list", output_tensor_list, self._size)
            for i, t in enumerate(outs):
                c.same_dtype("gather", f"output_tensor_list[{i}]", t, "input_tensor",
                             input_tensor)
                c.numel("gather", f"output_tensor_list[{i}]", t, input_tensor.numel(),
                        "the same as input_tensor")
            bouts = [self._out(t, fin, "gather") for t in outs]
        return self._issue("gather", self._backend.gather,
                           (bouts, _contiguous_in(input_tensor), root), async_op, timeout, hints,
                           fin or None, (output_tensor_list, input_tensor, root))

    def gather_single(self, output: torch.Tensor, input: torch.Tensor, root: int,
                      async_op: bool = False, hints: dict[str, str] | None = None,
                      timeout: timedelta | None = None) -> TorchWork:
        timeout, hints = self._begin("gather_single", timeout, hints)
        c = self._check
        c.tensor("gather_single", "input", input)
        root = c.peer("gather_single", "root", root)
        fin: list[Callable[[], None]] = []
        out = output
        if self._rank == root:
            c.tensor("gather_single", "output", output)
            c.same_dtype("gather_single", "output", output, "input", input)
            c.numel("gather_single", "output", output, input.numel() * self._size,
                    f"input.numel() * size = {input.numel()} * {self._size}")
            out = self._out(output, fin, "gather_single")
        return self._issue("gather_single", self._backend.gather_single,
                           (out, _contiguous_in(input), root), async_op, timeout, hints,
                           fin or None, (output, input, root))

    # -- one-sided windows -----------------------------------------------------------

    def new_window(self, tensor: torch.Tensor | None = None) -> TorchCommWindow:
        """Create a one-sided window (collective); registers ``tensor`` at once if given.

        See :class:`torchcomms_core._window.TorchCommWindow`. Raises ``CommStateError``
        when the backend has no windows (``method_support()["new_window"]``).
        """
        if self._state is not _OK:
            self._ensure_usable("new_window")
        return create_window(self, tensor)

    # -- persistent all-gather --------------------------------------------------------

    def all_gather_p_init(self, output: torch.Tensor, hints: dict[str, str] | None = None,
                          timeout: timedelta | None = None) -> PersistentAllGather:
        """Bind ``output`` for repeated all-gathers; returns the handle ``exec`` takes."""
        self._begin("all_gather_p_init", timeout, hints)
        self._check.tensor("all_gather_p_init", "output", output)
        if output.numel() % self._size:
            raise CommInputError(
                f"all_gather_p_init: output has {output.numel()} elements, not a multiple of "
                f"the communicator size {self._size}"
            )
        return PersistentAllGather(self, output)

    def all_gather_p_exec(self, handle: PersistentAllGather, input: torch.Tensor,
                          async_op: bool = False, hints: dict[str, str] | None = None,
                          timeout: timedelta | None = None) -> TorchWork:
        """Gather every rank's ``input`` into the output bound by ``all_gather_p_init``."""
        if not isinstance(handle, PersistentAllGather) or handle.comm is not self:
            raise CommTypeError("all_gather_p_exec: handle must come from this communicator's "
                                "all_gather_p_init")
        if handle.output is None:
            raise CommStateError("all_gather_p_exec: the handle was freed by all_gather_p_free")
        return self.all_gather_single(handle.output, input, async_op, hints, timeout)

    def all_gather_p_free(self, handle: PersistentAllGather) -> None:
        """Release a handle from ``all_gather_p_init``; it cannot be executed again."""
        if not isinstance(handle, PersistentAllGather) or handle.comm is not self:
            raise CommTypeError("all_gather_p_free: handle must come from this communicator's "
                                "all_gather_p_init")
        handle.output = None

    # -- sub-communicators -----------------------------------------------------------

    def split(self, ranks: Sequence[int], name: str, hints: dict[str, str] | None = None,
              timeout: timedelta | None = None) -> TorchComm | None:
        """Create a sub-communicator of ``ranks`` (parent-local); non-members pass ``[]``.

        Members get a ``TorchComm`` whose ranks follow the sorted order of ``ranks``;
        non-members get ``None``. Every member must pass the same list.
        """
        if self._state is not _OK:
            self._ensure_usable("split")
        if not isinstance(ranks, (list, tuple, range)):
            raise CommTypeError(f"split: ranks must be a list of ints, got {type(ranks).__name__}")
        if not isinstance(name, str) or not name or "/" in name:
            raise CommInputError(f"split: name must be a non-empty string without '/', got "
                                 f"{name!r}")
        c = self._check
        members = [c.peer("split", f"ranks[{i}]", r) for i, r in enumerate(ranks)]
        hints = check_hints(hints, "split") if hints is not None else None
        timeout = check_timeout(timeout, "split") if timeout is not None else self._timeout
        if len(set(members)) != len(members):
            dupes = sorted({r for r in members if members.count(r) > 1})
            raise CommInputError(f"split: ranks {list(ranks)} contain duplicates {dupes}; "
                                 f"list each rank once")
        if members and self._rank not in members:
            raise CommInputError(
                f"split: ranks {list(ranks)} do not include this rank ({self._rank}); pass the "
                f"group this rank belongs to, or [] if it joins none"
            )
        hook_args = self._pre_plain("split", (list(ranks), name))
        from torch.distributed import PrefixStore

        members.sort()
        key = "_".join(map(str, members)) if members else "none"
        store = PrefixStore(f"split/{name}/{key}", self._store)
        options = self._options.replace(
            name=name, store=store, timeout=timeout,
            hints={**self._hints, **(hints or {})},
            rank=members.index(self._rank) if members else -1,
            size=len(members),
        )
        if not members:
            # Backends with a collective native split need every parent rank to take part.
            if self._support["split"] == "native":
                self._backend.split([], name, options)
            self._post_plain(hook_args)
            return None
        _claim_name(self._store, f"split/{name}", self._rank, self._name)
        try:
            child = self._backend.split(members, name, options)
            if child is None:
                raise TorchCommError(f"split: backend {self.get_backend()!r} returned no "
                                     f"communicator for members {members}")
        except BaseException:
            _release_name(self._store, f"split/{name}", self._rank)
            raise
        comm = TorchComm(child, self._device, name, options, store, self._backend_name)
        self._post_plain(hook_args)
        call_lifecycle("torchcomms_comm_created", comm=comm)
        return comm

    def _pre_plain(self, name: str, values: tuple[Any, ...], op_id: int | None = None) -> Any:
        """Run pre hooks for an operation that returns no work (split, finalize)."""
        if not (self._pre_hooks or self._post_hooks):
            return None
        if op_id is None:
            op_id = next_op_id()
        args = args_class(name)(name, op_id, values, False, None, None)
        args.work = TorchWork.not_started(self, name)
        for hook in tuple(self._pre_hooks.values()):
            hook(OpName[name], op_id, args)
        return args

    def _post_plain(self, args: Any) -> None:
        if args is None:
            return
        args.work._start(None, None)
        post = post_args(args, args.work)
        for hook in tuple(self._post_hooks.values()):
            hook(args.op_id, post)


# -- construction ----------------------------------------------------------------------


def _callable(fn: Any, where: str) -> Callable[..., Any]:
    if not callable(fn):
        raise CommTypeError(f"{where}: expected a callable, got {type(fn).__name__}")
    return fn


def _claim_name(store: Any, key: str, rank: int, parent: str | None = None) -> None:
    """Refuse a communicator name this rank already used with this store."""
    if store.add(f"names/{key}/{rank}", 1) > 1:
        store.add(f"names/{key}/{rank}", -1)
        where = f"split of {parent!r}" if parent else "this job"
        name = key.split("/", 1)[-1]
        raise CommInputError(
            f"a communicator named {name!r} already exists in {where} (rank {rank}); every "
            f"communicator needs a unique name: pass a different name="
        )


def _release_name(store: Any, key: str, rank: int) -> None:
    """Give back a name whose communicator could not be created, so a retry may use it."""
    try:
        store.add(f"names/{key}/{rank}", -1)
    except Exception:  # the store itself may be what failed; the original error matters
        pass


def _auto_name() -> str:
    # Auto names are "comm_<n>" in creation order, which only matches across ranks when
    # every rank creates its communicators in the same order: from one thread.
    if threading.current_thread() is not threading.main_thread():
        raise CommInputError(
            "new_comm: pass name= when creating a communicator from a thread other than the "
            "main thread; generated names follow creation order, which threads make "
            "different on different ranks"
        )
    return f"comm_{next(_auto_names)}"


def new_comm(
    backend: str,
    device: torch.device | str,
    name: str | None = None,
    abort_process_on_timeout_or_error: bool | None = None,
    timeout: timedelta | None = None,
    is_high_priority_stream: bool | None = None,
    store: Any = None,
    enable_reconfigure: bool = False,
    hints: dict[str, str] | None = None,
) -> TorchComm:
    """Create a communicator on ``backend`` and ``device``; returns once every rank joined.

    The parameters follow the reference's binding, positional order included.

    Args:
        backend: a backend name (``"gloo"``, ``"ncclx"``, an entry point or a name given to
            ``register_backend``).
        device: the device the communicator works on (``"cpu"``, ``torch.device("cuda")``).
        name: unique per process; every rank passes the same. Generated (``comm_<n>``) when
            omitted, which only the main thread may rely on.
        abort_process_on_timeout_or_error: abort the process when an operation fails or
            times out; default ``TORCHCOMM_ABORT_ON_ERROR`` (true).
        timeout: default timeout of every operation (``TORCHCOMM_TIMEOUT_SECONDS``, 600 s).
        is_high_priority_stream: GPU backends run on a high-priority stream; CPU backends
            ignore it. Passed to the backend as the hint ``high_priority_stream``.
        store: a c10d ``Store`` to rendezvous through; without it, rank and size come from
            the launcher's environment and the store from ``MASTER_ADDR``/``MASTER_PORT``
            (or ``TORCHCOMM_STORE_PATH``).
        enable_reconfigure: create the communicator unbound, for ``reconfigure``.
        hints: backend-specific ``dict[str, str]``.

    Returns:
        A ready :class:`TorchComm`.

    Raises:
        BackendNotFoundError, BackendLoadError: the backend is not installed or cannot run.
        BootstrapError: rank, size or the store could not be determined.
        CommInputError, CommTypeError: an argument was refused.
        CommTimeoutError: some rank did not join within ``timeout``.
    """
    if not isinstance(backend, str) or not backend:
        raise CommTypeError(f"new_comm: backend must be a backend name such as 'gloo', "
                            f"got {backend!r}")
    try:
        device = torch.device(device)
    except (TypeError, RuntimeError) as exc:
        raise CommTypeError(f"new_comm: device {device!r} is not a torch.device: {exc}") from None
    if name is not None and (not isinstance(name, str) or not name or "/" in name):
        raise CommInputError(f"new_comm: name must be a non-empty string without '/', got "
                             f"{name!r}")
    if timeout is not None:
        timeout = check_timeout(timeout, "new_comm")
    else:
        try:
            timeout = _env.default_timeout()
        except ValueError as exc:
            raise CommInputError(f"new_comm: {exc}") from None
    hints = dict(check_hints(hints, "new_comm")) if hints is not None else {}
    if abort_process_on_timeout_or_error is None:
        try:
            abort_process_on_timeout_or_error = _env.abort_on_error()
        except ValueError as exc:
            raise CommInputError(f"new_comm: {exc}") from None
    elif not isinstance(abort_process_on_timeout_or_error, bool):
        raise CommTypeError(f"new_comm: abort_process_on_timeout_or_error must be a bool or "
                            f"None, got {abort_process_on_timeout_or_error!r}")
    if is_high_priority_stream is not None:
        if not isinstance(is_high_priority_stream, bool):
            raise CommTypeError(f"new_comm: is_high_priority_stream must be a bool or None, "
                                f"got {is_high_priority_stream!r}")
        hints.setdefault("high_priority_stream", "true" if is_high_priority_stream else "false")
    load_plugins()
    cls = get_backend_class(backend)
    ok, reason = cls.is_available()
    if not ok:
        raise BackendLoadError(f"new_comm: backend {backend!r} cannot run here: {reason}")
    if device.type not in cls.devices:
        raise CommInputError(
            f"new_comm: backend {backend!r} runs on {', '.join(cls.devices)} devices, not "
            f"{device.type!r}; pass e.g. torch.device({cls.devices[0]!r})"
        )
    if enable_reconfigure:  # unbound until reconfigure; needs no peer now
        from ._reconfigure import new_reconfigurable_comm

        return new_reconfigurable_comm(cls, backend, device, name or _auto_name(), store,
                                       timeout, hints, abort_process_on_timeout_or_error)
    from .pytorch.c10d_context import creating_group

    # Under TORCH_DISTRIBUTED_USE_TORCHCOMMS, init_process_group's rank, size and timeout.
    c10d_group = creating_group(store)
    if c10d_group is not None:
        rank, size = c10d_group.rank, c10d_group.size
        timeout = c10d_group.timeout or timeout
    else:
        rank, size, _source = resolve_rank_size()
    if name is None:
        name = _auto_name()
    root = store if store is not None else default_store(rank, size, timeout,
                                                         required=cls.needs_store)
    from torch.distributed import PrefixStore

    if c10d_group is None:  # c10d keeps live group names unique, and reuses destroyed ones
        _claim_name(root, name, rank)
    comm_store = PrefixStore(f"comm/{name}", root)
    options = CommOptions(
        abort_process_on_timeout_or_error=abort_process_on_timeout_or_error,
        timeout=timeout,
        store=comm_store,
        name=name,
        enable_reconfigure=enable_reconfigure,
        hints=hints,
        rank=rank,
        size=size,
    )
    instance = cls()
    instance._bind(device, name, options)
    try:
        instance.init(device, name, options)
    except TorchCommError:
        _release_name(root, name, rank)
        raise
    except Exception as exc:
        _release_name(root, name, rank)
        what = (f"new_comm: backend {backend!r} could not create communicator {name!r} on rank "
                f"{rank} of {size}")
        if is_timeout_error(exc):
            raise CommTimeoutError(
                f"{what} within {timeout}: {exc}. Every rank must call new_comm with the same "
                f"name; check that all {size} ranks are running and can reach each other"
            ) from exc
        raise CommOperationError(f"{what}: {exc}") from exc
    # A backend may pin the device further (cuda -> cuda:<local rank>).
    bound = getattr(instance, "device", None)
    if isinstance(bound, torch.device) and bound.type == device.type:
        device = bound
    comm = TorchComm(instance, device, name, options, comm_store, backend)
    call_lifecycle("torchcomms_comm_created", comm=comm)
    return comm

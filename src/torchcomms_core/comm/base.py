"""The base of ``TorchComm``: state, lifecycle, hooks, and the path every operation takes.

An operation (``comm.face``) starts with ``_guard`` (state guard, per-call timeout and
hints), has its form (``comm.forms``) check its arguments and stage its tensors on the
returned ``comm.call.Call`` (contiguous stand-ins copied back on completion, AVG and
PREMUL_SUM lowered to SUM), and ends with ``_issue`` (hooks, backend call, ``TorchWork``).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn, cast

import torch

from torchcomms_core.comm import lean
from torchcomms_core.comm.call import Call, run_post_hooks, run_pre_hooks
from torchcomms_core.comm.consistency import verify_call
from torchcomms_core.comm.handles import RemovableHandle
from torchcomms_core.comm.keywords import adapt_backend
from torchcomms_core.comm.lifetime import LIVE, Membership, release_dropped, release_live_at_exit
from torchcomms_core.creation.signing import find_signer
from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import CommStateError
from torchcomms_core.foundation.states import ABORTED, FAILED, FINALIZED, OK, UNBOUND
from torchcomms_core.foundation.work import (
    TorchWork,
    WorkStatus,
    is_engine_failure,
    raised_by_plugin_code,
)
from torchcomms_core.operations.args import FINALIZE_OP_ID, OpArgs, OpName
from torchcomms_core.operations.hints import core_hint_keys, warn_unknown_hints
from torchcomms_core.operations.options import CommOptions
from torchcomms_core.operations.reduce_op import RedOpType
from torchcomms_core.operations.validation import Checker, check_hints, check_timeout, lean_pairs
from torchcomms_core.plugin_host.backends import backend_version, get_mem_allocator
from torchcomms_core.plugin_host.manager import call_lifecycle, failed_plugins, load_plugins
from torchcomms_core.spec import TorchCommBackend, method_support

# Registered after every import above: exit handlers run last-registered first, so the
# communicators are released before the engines they run on are torn down.
atexit.register(release_live_at_exit)


def live_communicators() -> list[CommBase]:
    """The communicators of this process not yet garbage-collected."""
    return list(LIVE)


class CommBase:
    """State, hooks and the issuing path every ``TorchComm`` operation goes through.

    ``TorchComm`` (``comm.operations``) adds the operations; this class alone holds a
    communicator's mutable state: construction, identity, the lifecycle (finalize, abort,
    failure), hook registration, and the internal interface the rest of the package uses
    (:attr:`INTERFACE`): the state guard, per-call checks, staging and backend call shared
    by every operation.
    """

    #: The members other modules of ``torchcomms_core.comm`` may use; nothing outside the
    #: package uses any ``_`` member (``tests/plugins/test_import_contract.py`` checks both).
    INTERFACE = frozenset(
        {
            "_guard",  # start an operation: state guard, checked timeout and hints
            "_issue",  # hooks, backend call, the TorchWork
            "_check_usable",  # refuse an operation on an unusable communicator
            "_hooks_before",  # hooks of an operation that returns no work
            "_hooks_after",
            "_unbind",  # leave the group (reconfigure): returns the previous state
            "_rebind",  # join a new group (reconfigure)
            "_membership",  # fault-tolerance state kept between reconfigures
            "_default_hints",
            "_self_p2p",  # whether sends and receives may name this rank
            "_raise_issue_error",
            "_reduced",
            "_release_quietly",  # release at interpreter exit (comm.lifetime)
            "_on_ending",  # a step before the backend is torn down (device windows)
        }
    )

    def __init__(
        self,
        backend: TorchCommBackend,
        device: torch.device,
        name: str,
        options: CommOptions,
        store: Any,
        backend_name: str | None = None,
        membership: Membership | None = None,
    ) -> None:
        adapt_backend(backend)  # reference-style methods without timeout=/hints=
        self._backend = backend
        self._backend_name = backend_name or backend.get_backend_name()
        self._device = device
        self._name = name
        self._options = options
        self._store = store
        # The job token's signing store is a Python object that the C++ prefixes over it
        # do not keep alive: the communicator does, as long as its store may be used.
        self._signer = self._first_signer = find_signer(store)
        self._timeout: timedelta = options.timeout or _env.default_timeout()
        self._hints: dict[str, str] = dict(options.hints)
        self._state = OK
        self._failure: BaseException | None = None
        self._pre_hooks: dict[int, Callable[..., Any]] = {}
        self._post_hooks: dict[int, Callable[..., Any]] = {}
        self._abort_hooks: dict[int, Callable[..., Any]] = {}
        # Run when the communicator starts to end, before its backend is torn down
        # (``_on_ending``): device windows stop their proxy threads there.
        self._ending_steps: dict[int, Callable[..., Any]] = {}
        # Told after every _relean (see register_lane_listener).
        self._lane_listeners: dict[int, Callable[[], None]] = {}
        self._lock = threading.Lock()
        # Async works not yet waited on; at exit a communicator with any is aborted rather
        # than finalized, so exit never waits for a peer that will not come.
        self._inflight: weakref.WeakSet[TorchWork] = weakref.WeakSet()
        self._native_ops = frozenset(type(backend).supported_reduce_ops)
        self._support = method_support(type(backend))
        self._check_calls = _env.check_collectives()
        # The lean lane (``comm.lean``, see ``_relean``) serves CPU communicators without
        # call checking.
        self._lean_static = device.type == "cpu" and not self._check_calls
        self._lean_bare = False  # the lean lane's conditions but for the hooks
        # Fault tolerance: given (unbound until the first reconfigure) with enable_reconfigure.
        self._membership = membership or Membership(root_store=store)
        if membership is not None:
            self._state = UNBOUND
        self._bind(backend.get_rank(), backend.get_size())
        self._relean()
        LIVE.add(self)

    def _bind(self, rank: int, size: int) -> None:
        """Take ``rank`` and ``size`` (creation and reconfigure) and arm the GC release."""
        self._rank, self._size = rank, size
        self._check = Checker(
            self._name,
            self._device,
            rank,
            size,
            type(self._backend).supported_dtypes,
            self._native_ops,
        )
        self._lean_pairs = lean_pairs(type(self._backend).supported_dtypes, self._native_ops)
        #: Whether sends and receives may name this rank (``allows_self_p2p``).
        self._self_p2p = bool(getattr(type(self._backend), "allows_self_p2p", True))
        self._failure = None
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is None or not finalizer.alive:  # abort() detaches it
            self._finalizer = weakref.finalize(self, release_dropped, self._backend, self._name)
            self._finalizer.atexit = False

    # -- identity and what plugin authors may use -------------------------------------

    def get_rank(self) -> int:
        """This process's rank in the communicator, ``0 <= rank < get_size()``.

        A ``reconfigure`` that moves this process to a new group changes it.
        """
        return self._rank

    def get_size(self) -> int:
        """The number of ranks in the communicator (a ``reconfigure`` may change it)."""
        return self._size

    def get_name(self) -> str:
        """The communicator's name: ``new_comm``'s ``name``, or the generated ``comm_<n>``."""
        return self._name

    def get_device(self) -> torch.device:
        """The ``torch.device`` the communicator works on (``new_comm``'s ``device``)."""
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
        warnings.warn(
            "TorchComm.mem_allocator is deprecated; call get_mem_allocator()",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.get_mem_allocator()

    def get_options(self) -> CommOptions:
        """The ``CommOptions`` the backend was initialised with (store, rank, size, timeout,
        hints, name).

        The communicator's own object, not a copy: ``set_timeout`` and ``reconfigure``
        update it; ``set_hints`` does not (its hints are the ones given at creation).
        """
        return self._options

    def get_backend_impl(self) -> TorchCommBackend:
        """The backend object (a ``TorchCommBackend``); plugin collectives call its methods."""
        return self._backend

    def unsafe_get_backend(self) -> TorchCommBackend:
        """Deprecated alias of :meth:`get_backend_impl` (the engine is ``.engine`` on it)."""
        warnings.warn(
            "TorchComm.unsafe_get_backend() is deprecated; use get_backend_impl()",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._backend

    def method_support(self) -> dict[str, str]:
        """Which operations the backend runs natively and which the core derives."""
        return dict(self._support)

    @property
    def checker(self) -> Checker:
        """The argument checker of this communicator (for plugin collectives).

        ``.tensor(op, arg, t)``, ``.tensor_list``, ``.blocks``, ``.pair``, ``.peer``,
        ``.same_dtype``, ``.numel`` and ``.reduce_op`` raise the built-in operations' errors.
        """
        return self._check

    @property
    def native_reduce_ops(self) -> frozenset[RedOpType]:
        """Reduce operations the backend runs itself (the core derives AVG/PREMUL_SUM)."""
        return self._native_ops

    def tensor_register(self, tensor: torch.Tensor) -> None:
        """Pre-register ``tensor``'s memory with the backend (a no-op where it has none)."""
        self._check.tensor("tensor_register", "tensor", tensor)
        getattr(self._backend, "tensor_register", lambda t: None)(tensor)

    def tensor_deregister(self, tensor: torch.Tensor) -> None:
        """Release a registration made by :meth:`tensor_register`."""
        self._check.tensor("tensor_deregister", "tensor", tensor)
        getattr(self._backend, "tensor_deregister", lambda t: None)(tensor)

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

    def get_timeout(self) -> timedelta:
        """The default timeout of the communicator's operations.

        ``new_comm``'s ``timeout``, else ``TORCHCOMM_TIMEOUT_SECONDS``, until
        :meth:`set_timeout` changes it; an operation's own ``timeout=`` overrides it for
        that call.
        """
        return self._timeout

    def set_timeout(self, timeout: timedelta) -> None:
        """Set the default timeout of every later operation."""
        self._timeout = check_timeout(timeout, "set_timeout")
        self._options.timeout = self._timeout
        self._backend.set_timeout(self._timeout)
        self._relean()  # the backend's lean calls are made for one timeout and hints

    def set_hints(self, hints: dict[str, str]) -> None:
        """Replace the communicator's default hints, passed to the backend with every later
        operation that gives no ``hints=`` of its own.

        A key the backend does not declare warns ``UnknownHintWarning`` (once per backend
        and key in a process); the hints are set all the same.

        Args:
            hints: the new hints; they replace the current ones rather than add to them.

        Raises:
            CommTypeError: ``hints`` is not a ``dict[str, str]``.
        """
        self._hints = dict(check_hints(hints, "set_hints"))
        warn_unknown_hints(
            self._backend_name, core_hint_keys(type(self._backend).hint_keys), self._hints
        )
        self._relean()

    def __copy__(self) -> CommBase:
        return self  # a communicator is a live endpoint: copies are the same object

    def __deepcopy__(self, memo: dict[int, Any]) -> CommBase:
        # The same object, recorded in memo as the reference does (an entry already there
        # wins, as copy.deepcopy itself would honour it).
        return cast(CommBase, memo.setdefault(id(self), self))

    def __getattr__(self, item: str) -> Any:
        # Only reached for unknown attributes: plugin collectives are installed on the
        # class when plugins load, so load them once and look again.
        if item.startswith("_"):
            raise AttributeError(item)
        load_plugins()
        if item in type(self).__dict__:
            return getattr(self, item)
        failed = failed_plugins()
        hint = (
            "; plugins that failed to load: " + "; ".join(r.error for r in failed)
            if failed
            else "; torchcomms.list_collectives() lists what is available"
        )
        raise AttributeError(f"TorchComm has no attribute {item!r}{hint}")

    def __repr__(self) -> str:
        return (
            f"<TorchComm {self._name!r} backend={self.get_backend()} rank={self._rank}/"
            f"{self._size} device={self._device} {self._state}>"
        )

    # -- lifecycle -------------------------------------------------------------------

    def finalize(self) -> None:
        """Release the communicator after its operations complete. Idempotent and thread-safe.

        Every later operation raises :class:`CommStateError`. Operations still in flight are
        waited for (each up to its timeout); use :meth:`abort` to abandon them instead.
        """
        if not self._end(FINALIZED):
            return
        try:
            hook_args = self._hooks_before("finalize", (), FINALIZE_OP_ID)
        finally:  # a failing hook must not leave the engine running
            self._backend.finalize()
        self._hooks_after(hook_args)
        self._run_finalized_steps()
        call_lifecycle("torchcomms_comm_finalized", comm=self)

    def _on_ending(self, step: Callable[[], object]) -> RemovableHandle:
        """Run ``step`` when the communicator starts to end (finalize, abort, release at exit),
        before its backend is torn down; the handle's ``remove()`` drops it."""
        return RemovableHandle(self._ending_steps, step, "_on_ending")

    def _on_finalized(self, step: Callable[[], object]) -> None:
        """Run ``step`` once the communicator is finalized or aborted (its name is given
        back this way)."""
        steps = self.__dict__.setdefault("_finalized_steps", [])
        steps.append(step)

    def _run_finalized_steps(self) -> None:
        for step in self.__dict__.pop("_finalized_steps", ()):
            try:
                step()
            except Exception:  # the communicator is gone either way
                pass

    def abort(self) -> None:
        """Tear the communicator down now, abandoning operations in flight; runs abort hooks.

        Returns without waiting for peers. Works still in flight raise
        :class:`CommStateError` from ``wait()``. Idempotent and thread-safe.
        """
        if not self._end(ABORTED):
            return
        self._run_abort_hooks()
        if self.is_abort_supported():
            self._backend.abort()
        else:
            self._backend.finalize()
        self._run_finalized_steps()
        call_lifecycle("torchcomms_comm_aborted", comm=self, reason="abort")

    def _end(self, state: str, only_from: tuple[str, ...] = ()) -> bool:
        """Move to a terminal ``state`` once (``only_from``: just from those states)."""
        with self._lock:
            if (
                self._state is FINALIZED
                or self._state is ABORTED
                or (only_from and self._state not in only_from)
            ):
                return False
            self._state = state
        self._relean()
        for step in tuple(self._ending_steps.values()):
            try:
                step()
            except Exception:  # ending goes on whatever a step does
                pass
        self._finalizer.detach()
        self._membership.clients.clear()  # connections to other members' rendezvous
        return True

    def _release_quietly(self) -> None:
        """Release at interpreter exit: finalize, or abort when operations are in flight."""
        if any(
            w._status is WorkStatus.INPROGRESS and not w._engine_done()
            for w in list(self._inflight)
        ):
            self.abort()
        elif self._end(FINALIZED, only_from=(OK, FAILED)):
            self._backend.finalize()

    def is_aborted(self) -> bool:
        """Whether :meth:`abort` ended the communicator."""
        return self._state is ABORTED

    def is_finalized(self) -> bool:
        """Whether :meth:`finalize` ended the communicator."""
        return self._state is FINALIZED

    def is_abort_supported(self) -> bool:
        """Whether the backend implements ``abort`` itself (``method_support()["abort"] ==
        "native"``); where it does not, :meth:`abort` finalizes the backend instead."""
        return self._support.get("abort") == "native"

    def get_init_handle(self) -> str:
        """An opaque handle naming this rank's endpoint of the communicator."""
        handle = self._membership.handle
        if handle is not None:  # enable_reconfigure: the token reconfigure expects
            return handle
        return f"{self.get_backend()}://{self._name}/{self._rank}"

    # -- the package's internal interface (INTERFACE) -------------------------------

    def _check_usable(self, op: str) -> None:
        """Raise :class:`CommStateError` for ``op`` unless the communicator is usable."""
        if self._state is not OK:
            self._ensure_usable(op)

    def _default_hints(self) -> dict[str, str]:
        """A copy of the communicator's default hints (``set_hints``)."""
        return dict(self._hints)

    def _unbind(self) -> str:
        """Leave the group (reconfigure starts): no operation runs until ``_rebind``.

        Returns the state before, which says what the old engine needs to be dropped.
        """
        with self._lock:
            prev = self._state
            self._state = UNBOUND
        self._relean()
        return prev

    def _rebind(self, rank: int, size: int, store: Any, options: CommOptions) -> None:
        """Join a new group as ``rank`` of ``size``: ``store`` is the group's store (its
        splits, windows and the PyTorch bridge's further groups meet there), ``options``
        what the backend was rebuilt with."""
        self._store = store
        self._signer = find_signer(store)  # the group's; the first stays with the membership
        self._backend.options = options.replace(store=store)
        self._options.rank, self._options.size = rank, size
        self._options.store = store
        self._bind(rank, size)
        with self._lock:
            self._state = OK
        self._relean()

    def _ensure_usable(self, op: str) -> None:
        state = self._state
        if state is UNBOUND:
            raise CommStateError(
                f"{op}: communicator {self._name!r} was created with enable_reconfigure=True "
                f"and is not bound to a group yet (or its last reconfigure failed); call "
                f"comm.reconfigure(uuid, init_handles) first"
            )
        if state is FINALIZED or state is ABORTED:
            raise CommStateError(
                f"{op}: communicator {self._name!r} was {state}; create a new "
                f"one with torchcomms.new_comm()"
            )
        raise CommStateError(
            f"{op}: communicator {self._name!r} failed earlier ({self._failure}) and cannot run "
            f"more operations; finalize it and create a new communicator"
        ) from self._failure

    def on_work_failure(self, work: TorchWork, error: BaseException) -> None:
        """An engine failure ended ``work``: mark the communicator failed, run the abort hooks.

        ``TorchWork`` calls it on the communicator it holds (the ``Communicator`` protocol of
        ``foundation.protocols``) with the error its ``wait()`` raises; user code has no
        reason to. Later operations raise ``CommStateError``."""
        with self._lock:
            if self._state is not OK:
                return
            self._state = FAILED
            self._failure = error
        self._relean()
        self._run_abort_hooks()
        call_lifecycle("torchcomms_comm_aborted", comm=self, reason=str(error))
        # With enable_reconfigure a failure revokes the communicator; recovery is reconfigure.
        if self._options.abort_process_on_timeout_or_error and not self._options.enable_reconfigure:
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
                warnings.warn(
                    f"torchcomms abort hook {hook!r} raised {exc!r}", RuntimeWarning, stacklevel=2
                )

    # -- hooks -----------------------------------------------------------------------

    def register_pre_hook(self, callback: Callable[[OpName, int, Any], None]) -> RemovableHandle:
        """Call ``callback(name, op_id, args)`` before each operation is issued.

        ``args`` is the operation's ``<Op>PreHookArgs``; ``args.work`` is its ``TorchWork``
        (status ``NOT_STARTED``). The handle's ``remove()`` unregisters the hook.
        """
        return RemovableHandle(self._pre_hooks, callback, "register_pre_hook", self._relean)

    def register_post_hook(self, callback: Callable[[int, Any], None]) -> RemovableHandle:
        """Call ``callback(op_id, args)`` after each operation is issued.

        ``args`` is a ``CollectivePostHookArgs`` (``SplitPostHookArgs``, ...) with the
        operation's ``work``; synchronous operations have completed by then.
        """
        return RemovableHandle(self._post_hooks, callback, "register_post_hook", self._relean)

    def register_abort_hook(self, callback: Callable[[], None]) -> RemovableHandle:
        """Call ``callback()`` when the communicator aborts or an operation fails or times out."""
        return RemovableHandle(self._abort_hooks, callback, "register_abort_hook")

    def register_lane_listener(self, callback: Callable[[], None]) -> RemovableHandle:
        """Call ``callback()`` whenever :meth:`takes_lean_calls` may answer differently.

        That is after the hooks, the state, the default timeout or the hints changed. A
        caller that would ask on every operation (the c10d bridge) asks once per change
        instead. ``callback`` runs on the thread that made the change, and must not raise.
        """
        return RemovableHandle(self._lane_listeners, callback, "register_lane_listener")

    def _hooks_before(
        self, name: str, values: tuple[Any, ...], op_id: int | None = None
    ) -> OpArgs | None:
        """Pre hooks of an operation that returns no work (split, new_window, finalize)."""
        if not (self._pre_hooks or self._post_hooks):
            return None
        return run_pre_hooks(self, self._pre_hooks, name, values, op_id=op_id)

    def _hooks_after(self, args: OpArgs | None) -> None:
        if args is not None:
            work = args.work
            assert work is not None  # set by run_pre_hooks
            work._start(None, None)
            run_post_hooks(self._post_hooks, args, work)

    # -- issuing ---------------------------------------------------------------------

    def _guard(self, op: str, timeout: Any, hints: Any) -> Call:
        """Start an operation: refuse it on an unusable communicator, check timeout and hints.

        Runs first in every operation, so a bad value never reaches the engine and never
        changes the communicator's state.
        """
        if self._state is not OK:
            self._ensure_usable(op)
        if timeout is not None:
            timeout = check_timeout(timeout, op)
        if hints is not None:
            hints = check_hints(hints, op)
        return Call(op, timeout, hints)

    def _issue(
        self,
        call: Call,
        bargs: tuple[Any, ...],
        async_op: bool,
        values: tuple[Any, ...],
        method: Callable[..., Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> TorchWork:
        """Run hooks, call ``method`` (default: the backend's method named like the
        operation) with ``bargs`` and wrap what it returns; ``values`` are for hooks."""
        name, timeout, hints = call.op, call.timeout, call.hints
        if method is None:
            method = getattr(self._backend, name)
        args = None
        if self._pre_hooks or self._post_hooks:
            args = run_pre_hooks(self, self._pre_hooks, name, values, async_op, timeout, hints)
        if timeout is None:
            timeout = self._timeout
        if hints is None:
            hints = self._hints
        try:
            if self._check_calls:
                verify_call(self._backend, name, values, self._size, timeout)
            if extra:
                inner = method(*bargs, async_op, timeout=timeout, hints=hints, **extra)
            else:
                inner = method(*bargs, async_op, timeout=timeout, hints=hints)
        except Exception as exc:
            self._raise_issue_error(exc, name)
        finishers = call.finishers
        if args is None or args.work is None:
            work = TorchWork(inner, finishers, self, name)
        else:
            work = args.work
            work._start(inner, finishers)
        if not async_op and (inner is not None or finishers):
            work.wait()
        elif async_op and work._status is WorkStatus.INPROGRESS:
            self._inflight.add(work)
        if args is not None:
            run_post_hooks(self._post_hooks, args, work)
        return work

    def _raise_issue_error(self, exc: Exception, name: str) -> NoReturn:
        """Raise for ``exc`` from a backend call issuing ``name``.

        A refusal by the backend's own checks leaves the communicator fine and is raised as
        is; an engine failure while issuing (sync calls wait inside the backend) is
        classified and updates the communicator exactly as a failed ``wait()`` would.
        """
        if not is_engine_failure(exc) or raised_by_plugin_code(exc, self._backend):
            raise exc  # a refusal, or a plugin's own Python error: the communicator is fine
        error = TorchWork.failed(exc, self, name).error
        if error is None or error is exc:
            raise exc
        raise error from exc

    def _relean(self) -> None:
        """Rebuild the lean lane (``comm.lean``): ``_lane`` is ``None`` unless it may be used.

        Called whenever the state, the hooks, the default timeout or the hints change: the
        lane is made for one timeout and one set of hints (see ``comm.lean.COMMUNICATOR``
        for what the communicator must be).
        """
        self._lean_bare = self._lean_static and self._state is OK
        self._lane = (
            lean.build(
                self,
                self._backend,
                self._size,
                self._check.dtypes,
                self._lean_pairs,
                self._timeout,
                self._hints,
            )
            if self._lean_bare and not self._pre_hooks and not self._post_hooks
            else None
        )
        for listener in tuple(self._lane_listeners.values()):
            listener()

    def lean_lane(self) -> lean.Lane | None:
        """The lean lane plain calls take now (``comm.lean.Lane``; ``None``: the general
        path), rebuilt on each change :meth:`register_lane_listener` announces."""
        return self._lane

    def takes_lean_calls(self, own_hooks: int = 0) -> bool:
        """Whether operations may skip the general path right now.

        True for a usable CPU communicator without hooks and without call checking (the
        conditions of the lean lane, see ``_relean``): nothing would observe what the
        general path adds. ``own_hooks``: the caller registered that many pre hooks and as
        many post hooks and does their work itself; with those and no others it is still
        true. The c10d bridge reads it on every call to hand c10d's own arguments straight
        to the backend's engine, as a plain c10d group would (recording into the flight
        recorder itself when that is the only hook).
        """
        if self._lane is not None:
            return True
        return (
            own_hooks > 0
            and self._lean_bare
            and len(self._pre_hooks) == own_hooks
            and len(self._post_hooks) == own_hooks
        )


def run_when_finalized(comm: CommBase, step: Callable[[], object]) -> None:
    """Run ``step`` once ``comm`` is finalized or aborted (``new_comm`` gives a
    communicator's name back this way)."""
    comm._on_finalized(step)


def is_bound_and_usable(comm: CommBase) -> bool:
    """Whether ``comm`` is bound to a group and usable: not finalized, aborted or failed,
    and not between the unbind and the rebind of a reconfigure."""
    return comm._state is OK

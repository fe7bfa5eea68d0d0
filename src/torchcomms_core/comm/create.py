"""``new_comm``: resolve a backend, rendezvous, and build a ``TorchComm``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.comm.base import run_when_finalized
from torchcomms_core.comm.lifetime import Membership
from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.comm.reconfigure import make_handle, refusal, supports_reconfigure
from torchcomms_core.creation.bootstrap import default_store, hosts_store, resolve_rank_size
from torchcomms_core.creation.group_record import GroupContext, creating_group, given_group
from torchcomms_core.creation.join import join_or_finalize
from torchcomms_core.creation.names import auto_name, check_name, claim_name, release_name
from torchcomms_core.creation.pg_options import hints_from_pg_options
from torchcomms_core.creation.signing import HINT as _TOKEN_HINT
from torchcomms_core.creation.signing import (
    TOKEN_ADVICE,
    is_signed,
    job_token,
    signing_store,
)
from torchcomms_core.creation.signing import refusal as token_refusal
from torchcomms_core.engines.c10d_registered import C10dRegisteredBackend
from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import (
    BackendLoadError,
    BackendNotFoundError,
    CommInputError,
    CommOperationError,
    CommTimeoutError,
    CommTypeError,
    TorchCommError,
)
from torchcomms_core.foundation.work import engine_start_error
from torchcomms_core.operations.hints import core_hint_keys, warn_unknown_hints
from torchcomms_core.operations.options import CommOptions
from torchcomms_core.operations.validation import check_hints, check_timeout
from torchcomms_core.plugin_host.backends import get_backend_class
from torchcomms_core.plugin_host.manager import call_lifecycle, load_plugins
from torchcomms_core.plugin_host.tuners import agree_after_init, confirm_tuning, make_tuning
from torchcomms_core.spec import TorchCommBackend


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
            ignore it. Passed to the backend as the hint ``is_high_priority_stream``.
        store: a c10d ``Store`` to rendezvous through; without it, rank and size come from
            the launcher's environment and the store from ``MASTER_ADDR``/``MASTER_PORT``
            (or ``TORCHCOMM_STORE_PATH``).
        enable_reconfigure: create the communicator unbound, for ``reconfigure``. Without
            ``store`` it needs no launcher and no peer: it hosts its own rendezvous, which
            ``get_init_handle()`` names (docs/fault-tolerance.md).
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
        raise CommTypeError(
            f"new_comm: backend must be a backend name such as 'gloo', got {backend!r}"
        )
    try:
        device = torch.device(device)
    except (TypeError, RuntimeError) as exc:
        raise CommTypeError(f"new_comm: device {device!r} is not a torch.device: {exc}") from None
    if name is not None:
        check_name(name, "new_comm")
    if timeout is not None:
        timeout = check_timeout(timeout, "new_comm")
    else:
        try:
            timeout = _env.default_timeout()
        except ValueError as exc:
            raise CommInputError(f"new_comm: {exc}") from None
    hints = dict(check_hints(hints, "new_comm")) if hints is not None else {}
    # The job token goes no further than the store that signs with it: never into the
    # options, the backend's hints, a log or a repr.
    trust = {_TOKEN_HINT: hints.pop(_TOKEN_HINT)} if _TOKEN_HINT in hints else {}
    job_token(trust)  # refuse a token too short to be secret, before anything starts
    if abort_process_on_timeout_or_error is None:
        try:
            abort_process_on_timeout_or_error = _env.abort_on_error()
        except ValueError as exc:
            raise CommInputError(f"new_comm: {exc}") from None
    elif not isinstance(abort_process_on_timeout_or_error, bool):
        raise CommTypeError(
            f"new_comm: abort_process_on_timeout_or_error must be a bool or "
            f"None, got {abort_process_on_timeout_or_error!r}"
        )
    if is_high_priority_stream is not None:
        if not isinstance(is_high_priority_stream, bool):
            raise CommTypeError(
                f"new_comm: is_high_priority_stream must be a bool or None, "
                f"got {is_high_priority_stream!r}"
            )
        hints.setdefault("is_high_priority_stream", "true" if is_high_priority_stream else "false")
    load_plugins()
    if store is not None:
        backend = _c10d_alias(backend, store)
    cls = _backend_class(backend)
    if not issubclass(cls, C10dRegisteredBackend):  # that one hands c10d's options on as is
        hints = _c10d_group_hints(backend, store, hints)
    warn_unknown_hints(backend, core_hint_keys(cls.hint_keys), hints)
    ok, reason = cls.is_available()
    if not ok:
        raise BackendLoadError(f"new_comm: backend {backend!r} cannot run here: {reason}")
    if device.type not in cls.devices:
        raise CommInputError(
            f"new_comm: backend {backend!r} runs on {', '.join(cls.devices)} devices, not "
            f"{device.type!r}; pass e.g. torch.device({cls.devices[0]!r})"
        )
    if enable_reconfigure:  # unbound until reconfigure; needs no peer now
        return new_reconfigurable_comm(
            cls,
            backend,
            device,
            name or auto_name(),
            store,
            timeout,
            hints,
            abort_process_on_timeout_or_error,
            trust,
        )
    # Under TORCH_DISTRIBUTED_USE_TORCHCOMMS, init_process_group's rank, size and timeout.
    c10d_group = creating_group(store)
    if c10d_group is not None:
        rank, size = c10d_group.rank, c10d_group.size
        timeout = c10d_group.timeout or timeout
    else:
        own = cls.own_rank_size(hints)
        rank, size = own if own is not None else resolve_rank_size()[:2]
    if name is None:
        name = auto_name()
    root = (
        store if store is not None else default_store(rank, size, timeout, required=cls.needs_store)
    )
    root = signing_store(root, trust)  # with a job token, once: prefixes over it share it
    generation = 1
    if c10d_group is None:  # c10d keeps live group names unique, and reuses destroyed ones
        generation = claim_name(root, name, rank)
    instance, options = _instance(
        cls,
        device,
        name,
        root,
        abort_process_on_timeout_or_error,
        timeout,
        hints,
        rank,
        size,
        generation=generation,
    )
    claims = root if c10d_group is None else None  # the bridge's groups claim no name
    # Whether the ranks share the store (mpi without MASTER_ADDR has one per process).
    shared = (
        store is not None
        or cls.needs_store
        or _env.master_addr_port() is not None
        or _env.store_file() is not None
    )
    try:
        # Every rank agrees on the tuner before the engine is built (#45).
        options.tuning = instance.tuning = make_tuning(
            instance,
            backend,
            device,
            options,
            shared_store=shared,
            what=f"new_comm: communicator {name!r}",
            claim_key=lambda r: f"names/{name}/{r}",
            claims=claims,
        )
        if c10d_group is not None and getattr(cls, "reads_c10d_group", False):
            # c10d's facts (global ranks, pg_options), for a backend that builds its
            # engine as c10d would; other backends' own new_comm calls stay unaffected.
            with given_group(c10d_group):
                instance.init(device, name, options)
        else:
            instance.init(device, name, options)
        if not instance.init_waits_for_peers():
            join_or_finalize(
                instance,
                options.store,
                size,
                timeout,
                f"new_comm: communicator {name!r}",
                claim_key=lambda r: f"names/{name}/{r}",
                claims=claims,
            )
        if shared:
            confirm_tuning(instance.tuning)
        else:
            agree_after_init(instance.tuning, instance, backend, device)
    except TorchCommError as exc:
        release_name(root, name, rank)
        refused = token_refusal(root, size, timeout, hosts_store(root))
        if refused is not None and refused is not exc:
            raise refused from exc
        if isinstance(exc, CommTimeoutError) and is_signed(root):
            raise CommTimeoutError(f"{exc}. {TOKEN_ADVICE}") from exc
        raise
    except Exception as exc:
        release_name(root, name, rank)
        refused = token_refusal(root, size, timeout, hosts_store(root))
        if refused is not None:  # it crossed the engine's C++ code as another error
            raise refused from exc
        what = (
            f"new_comm: backend {backend!r} could not create communicator {name!r} on rank "
            f"{rank} of {size}"
        )
        advice = (
            f". Every rank must call new_comm with the same name; check that all {size} "
            f"ranks are running and can reach each other"
        )
        if is_signed(root):
            advice += f". {TOKEN_ADVICE}"
        raise engine_start_error(what, timeout, exc, advice) from exc
    # A backend may pin the device further (cuda -> cuda:<local rank>).
    bound = getattr(instance, "device", None)
    if isinstance(bound, torch.device) and bound.type == device.type:
        device = bound
    comm = TorchComm(instance, device, name, options, options.store, backend)
    if c10d_group is None:  # finalized, it gives the name back for a later communicator
        run_when_finalized(comm, lambda: release_name(root, name, rank))
    call_lifecycle("torchcomms_comm_created", comm=comm, parent=None)
    return comm


def new_member_comm(
    backend: str,
    device: torch.device | str,
    *,
    name: str,
    store: Any,
    rank: int,
    size: int,
    timeout: timedelta,
    hints: dict[str, str] | None = None,
    abort_process_on_timeout_or_error: bool = False,
) -> TorchComm:
    """``new_comm`` as ``rank`` of ``size`` ranks meeting on ``store``, for backends built of
    communicators (``torchcomms-hier``'s levels): rank and size are given, not read from the
    launcher. By default a failure raises instead of aborting the process, so the composite
    communicator applies its own policy.

    Raises:
        What :func:`new_comm` raises.
    """
    if not (isinstance(rank, int) and isinstance(size, int) and 0 <= rank < size):
        raise CommInputError(f"new_member_comm: need 0 <= rank < size, got rank {rank} of {size}")
    context = GroupContext(rank, size, timeout, tuple(range(size)), None)
    with given_group(context):
        return new_comm(
            backend,
            device,
            name=name,
            store=store,
            timeout=timeout,
            hints=hints,
            abort_process_on_timeout_or_error=abort_process_on_timeout_or_error,
        )


def _c10d_group_hints(backend: str, store: Any, hints: dict[str, str]) -> dict[str, str]:
    """The hints of a group c10d is creating with ``pg_options``: what those options say
    (``creation.pg_options``), with c10d's ``persistent_store``, whichever route c10d took.
    torch 2.14's switch passes them only flattened into strings (every attribute of the
    options object, none of a dict's entries); any other call keeps its hints."""
    group = creating_group(store)
    if group is None or group.backend_options is None:
        return hints
    keep = {k: v for k, v in hints.items() if k == "persistent_store"}
    return {**keep, **hints_from_pg_options(backend, group.backend_options)}


def _c10d_alias(backend: str, store: Any) -> str:
    """The torchcomms backend ``TORCHCOMM_C10D_ALIASES`` names for c10d's ``backend`` while
    c10d creates a group (``gloo=shm``: code that hard-codes ``"gloo"``, such as
    Accelerate on CPU, runs on shm under the switch); ``backend`` itself otherwise."""
    try:
        aliases = _env.c10d_aliases()
    except ValueError as exc:
        raise CommInputError(f"new_comm: {exc}") from None
    if backend not in aliases or creating_group(store) is None:
        return backend
    return aliases[backend]


def _backend_class(backend: str) -> type[TorchCommBackend]:
    """The class serving ``backend``: a torchcomms backend of that name, else, when c10d
    has a backend registered under it (``torch.distributed.Backend.register_backend``:
    ucc, hccl, a vendor's), that backend served through the c10d adapter."""
    try:
        return get_backend_class(backend)
    except BackendNotFoundError:
        from torchcomms_core.engines.c10d_registered import c10d_registered_backend

        cls = c10d_registered_backend(backend)
        if cls is None:
            raise
        return cls


def new_reconfigurable_comm(
    cls: type[TorchCommBackend],
    backend: str,
    device: torch.device,
    name: str,
    store: Any,
    timeout: timedelta,
    hints: dict[str, str],
    abort_process: bool,
    trust: dict[str, str] | None = None,
) -> TorchComm:
    """``new_comm(..., enable_reconfigure=True)``: a communicator bound to no group yet.

    It does not wait for any peer: a replacement process creates its communicator alone
    and joins through ``reconfigure``.
    """
    if not supports_reconfigure(cls):
        raise RuntimeError(refusal(backend, cls, "new_comm"))
    rendezvous = None
    if store is None:  # host the rendezvous that this rank's handle names
        from torch._C._distributed_c10d import PrefixStore

        from torchcomms_core.creation.rendezvous import host_store

        address = cls.rendezvous_address(hints)
        try:
            rendezvous, host, port = host_store(address, timeout)
        except TorchCommError:
            raise
        except Exception as exc:
            where = "the address of this host's name" if address is None else address
            raise CommOperationError(
                f"new_comm: could not host the rendezvous of communicator {name!r} ({where}): {exc}"
            ) from exc
        handle = make_handle(backend, (host, port))
        # A local name keeps the signing store alive until the communicator holds it.
        signer = signing_store(rendezvous, trust)
        store = PrefixStore(f"rendezvous/{handle.split(':', 3)[2]}", signer)
    else:
        handle = make_handle(backend, None)
        store = signing_store(store, trust)
    instance, options = _instance(
        cls,
        device,
        name,
        store,
        abort_process,
        timeout,
        hints,
        rank=-1,
        size=0,
        enable_reconfigure=True,
    )
    # Unbound until the first reconfigure. A hosted rendezvous: peers reach it as
    # rendezvous/<token>, whatever their names.
    membership = Membership(handle, store if rendezvous is not None else options.store, rendezvous)
    return TorchComm(instance, device, name, options, options.store, backend, membership)


def _instance(
    cls: type[TorchCommBackend],
    device: torch.device,
    name: str,
    root: Any,
    abort_process: bool,
    timeout: timedelta,
    hints: dict[str, str],
    rank: int,
    size: int,
    enable_reconfigure: bool = False,
    generation: int = 1,
) -> tuple[TorchCommBackend, CommOptions]:
    """A backend instance bound to its options, working under ``comm/<name>`` of ``root``
    (``comm#<generation>/<name>`` for a name claimed again after its communicator ended,
    so no key of the earlier one is seen)."""
    from torch._C._distributed_c10d import PrefixStore

    prefix = f"comm/{name}" if generation == 1 else f"comm#{generation}/{name}"
    options = CommOptions(
        abort_process_on_timeout_or_error=abort_process,
        timeout=timeout,
        store=PrefixStore(prefix, root),
        name=name,
        enable_reconfigure=enable_reconfigure,
        hints=hints,
        rank=rank,
        size=size,
    )
    instance = cls()
    instance._bind(device, name, options)
    return instance, options

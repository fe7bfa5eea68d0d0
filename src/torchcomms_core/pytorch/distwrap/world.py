"""The process's distwrap world: which mode it runs in, and its groups over communicators.

``init_process_group(..., use_torchcomms=False)`` hands everything to ``torch.distributed``.
With ``use_torchcomms=True`` each group is a :class:`TorchCommsGroup`: one communicator per
device type, registered in ``torch.distributed``'s maps (so ``get_rank``,
``get_process_group_ranks`` and friends answer) but refusing direct ``torch.distributed``
collectives, which would bypass the communicators.
"""

from __future__ import annotations

import itertools
import os
import threading
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore
from torch.distributed import distributed_c10d as c10d

from torchcomms_core.comm.create import new_comm
from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.creation.group_record import GroupContext, given_group
from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import (
    BootstrapError,
    CommInputError,
    CommStateError,
    CommTypeError,
)

#: Device type of each backend name (``"cpu:gloo,cuda:nccl"`` names them explicitly).
DEVICE_OF_BACKEND = {
    "nccl": "cuda",
    "ncclx": "cuda",
    "rccl": "cuda",
    "rcclx": "cuda",
    "gloo": "cpu",
    "hccl": "mtia",
    "mpi": "cpu",
    "fake": "cpu",
}
#: What ``torch.distributed`` calls the backends it knows under another name.
C10D_NAME = {"ncclx": "nccl", "rcclx": "rccl"}

# Rank/world size when init_process_group is given -1, in the reference's order.
_RANK_SIZE_VARIABLES = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("RANK", "WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
    ("PMI_RANK", "PMI_SIZE"),
)

# c10d's ProcessGroup methods and the distwrap function to call instead.
_DIRECT_CALLS = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "allgather": "all_gather",
    "allgather_coalesced": "all_gather",
    "_allgather_base": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
    "monitored_barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "recv_anysource": "recv",
}


def parse_backend(backend: Any) -> dict[str, str]:
    """``{device type: backend}`` from ``"gloo"``, ``"ncclx"`` or ``"cpu:gloo,cuda:nccl"``."""
    if backend is None:
        raise CommInputError(
            "init_process_group(use_torchcomms=True) needs a backend, e.g. backend='gloo', "
            "'ncclx' or 'cpu:gloo,cuda:nccl'"
        )
    text = str(backend).strip().lower()
    pairs: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if ":" in part:
            device, _, name = part.partition(":")
            device, name = device.strip(), name.strip()
        else:
            name = part
            device = DEVICE_OF_BACKEND.get(name) or _declared_device(name)
        if not device or not name:
            raise CommInputError(
                f"backend {backend!r}: {part!r} is not 'backend' or 'device:backend'; pass "
                f"e.g. 'gloo' or 'cpu:gloo,cuda:nccl'"
            )
        if device in pairs:
            raise CommInputError(
                f"backend {backend!r} names device type {device!r} twice; give each device "
                f"type one backend"
            )
        pairs[device] = name
    if not pairs:
        raise CommInputError(f"backend {backend!r} names no backend; pass e.g. 'gloo'")
    return pairs


def _declared_device(name: str) -> str:
    """The first device type a registered backend declares (``mpi``, a vendor's, ...)."""
    from torchcomms_core.plugin_host.backends import get_backend_class

    return get_backend_class(name).devices[0]


def c10d_backend(backend: Any) -> Any:
    """The backend string for ``torch.distributed`` (``ncclx`` -> ``nccl``, per device too)."""
    if backend is None or not isinstance(backend, str):
        return backend
    parts = []
    for part in backend.split(","):
        device, sep, name = part.rpartition(":")
        name = C10D_NAME.get(name.strip().lower(), name.strip())
        parts.append(f"{device}{sep}{name}")
    return ",".join(parts)


def rank_and_size(rank: int, world_size: int) -> tuple[int, int]:
    """The given values, or the launcher's (OpenMPI, torchrun, SLURM, PMI) for -1."""
    if rank >= 0 and world_size > 0:
        return rank, world_size
    for rank_var, size_var in _RANK_SIZE_VARIABLES:
        r, s = os.environ.get(rank_var), os.environ.get(size_var)
        if r is None or s is None:
            continue
        try:
            found = int(r), int(s)
        except ValueError:
            raise BootstrapError(
                f"{rank_var}={r!r} / {size_var}={s!r} are not integers; fix the launcher's "
                f"environment or pass rank= and world_size="
            ) from None
        return (rank if rank >= 0 else found[0]), (world_size if world_size > 0 else found[1])
    tried = ", ".join(f"{r}/{s}" for r, s in _RANK_SIZE_VARIABLES)
    raise BootstrapError(
        f"init_process_group: rank and world_size were not given and none of {tried} are "
        f"set; pass rank= and world_size=, or launch with torchrun or mpiexec"
    )


class TorchCommsGroup(dist.ProcessGroup):
    """A process group of distwrap's torchcomms mode: one communicator per device type.

    ``torchcomms.distwrap`` runs every operation on ``comms[device type]``. Direct
    ``torch.distributed`` collectives on this group raise, naming the distwrap call.
    """

    def __init__(self, comms: dict[str, TorchComm], global_ranks: list[int], name: str) -> None:
        first = next(iter(comms.values()))
        super().__init__(first.get_rank(), first.get_size())  # type: ignore[call-arg]
        self.comms = comms
        self.global_ranks = list(global_ranks)
        self._name = name
        self._devices = [torch.device(d) for d in comms]
        self.split_count = 0

    # -- identity, as c10d asks of a group -----------------------------------------

    @property
    def group_name(self) -> Any:
        return self._name

    @property
    def group_desc(self) -> str:
        return self._name

    @property
    def _device_types(self) -> list[torch.device]:
        return list(self._devices)

    def _get_backend(self, device: Any) -> Any:
        return self  # never a _BackendWrapper: c10d then leaves finalizing to shutdown()

    def getBackendName(self) -> str:  # noqa: N802 - c10d's virtual method name
        """c10d's backend name: ``"<device>:<backend>"`` per communicator, comma-separated."""
        return ",".join(f"{d}:{c.get_backend()}" for d, c in self.comms.items())

    def __repr__(self) -> str:
        comms = ", ".join(f"{d}: {c.get_name()!r}" for d, c in self.comms.items())
        return f"<distwrap TorchCommsGroup {self._name!r} {{{comms}}}>"

    # -- what distwrap uses --------------------------------------------------------

    def comm_for(self, device: Any, what: str) -> TorchComm:
        """The communicator of ``device``'s type, or an error naming those this group has."""
        kind = torch.device(device).type
        comm = self.comms.get(kind)
        if comm is None:
            raise CommInputError(
                f"{what}: process group {self._name!r} has no communicator for {kind} tensors "
                f"(it has {', '.join(self.comms)}); initialise with a backend for that device, "
                f"e.g. init_process_group('cpu:gloo,cuda:nccl', use_torchcomms=True)"
            )
        return comm

    @property
    def default_comm(self) -> TorchComm:
        """The communicator of the first device type (barrier, object collectives)."""
        return next(iter(self.comms.values()))

    def group_rank(self, global_rank: int, what: str) -> int:
        """The rank in this group of the process whose global rank is ``global_rank``.

        Args:
            global_rank: a rank of the default group.
            what: the calling operation's name, for the error message.

        Raises:
            CommInputError: ``global_rank`` is not a member of the group.
        """
        try:
            return self.global_ranks.index(int(global_rank))
        except ValueError:
            raise CommInputError(
                f"{what}: global rank {global_rank} is not a member of process group "
                f"{self._name!r} (members {self.global_ranks}); pass a member's global rank, "
                f"or its rank in the group as group_src=/group_dst="
            ) from None

    def shutdown(self) -> None:
        """Finalize the group's communicators (``destroy_process_group`` calls this)."""
        for comm in self.comms.values():
            if not comm.is_finalized():
                comm.finalize()


def _refuse(method: str, replacement: str) -> Callable[..., Any]:
    def refused(self: TorchCommsGroup, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"torch.distributed called {method}() on process group {self._name!r}, which "
            f"torchcomms.distwrap created over torchcomms communicators: direct "
            f"torch.distributed collectives on it are refused. Call "
            f"torchcomms.distwrap.{replacement}(..., group=group) instead (e.g. `import "
            f"torchcomms.distwrap as dist`), or initialise with use_torchcomms=False to run "
            f"on torch.distributed itself"
        )

    refused.__name__ = method
    refused.__doc__ = f"Refused: use ``torchcomms.distwrap.{replacement}``."
    return refused


for _method, _replacement in _DIRECT_CALLS.items():
    setattr(TorchCommsGroup, _method, _refuse(_method, _replacement))
del _method, _replacement


class _World:
    """distwrap's state in this process (one, like ``torch.distributed``'s own)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.use_torchcomms = False
        self.world: TorchCommsGroup | None = None
        self.groups: list[TorchCommsGroup] = []
        self.inits = itertools.count()


WORLD = _World()


def torchcomms_mode() -> bool:
    """Whether distwrap was initialised with ``use_torchcomms=True`` (and not destroyed)."""
    return WORLD.use_torchcomms and WORLD.world is not None


def resolve(group: Any, what: str) -> TorchCommsGroup | None:
    """The torchcomms group an operation runs on, or ``None`` for ``torch.distributed``."""
    if group is None or group is dist.GroupMember.WORLD:
        if torchcomms_mode():
            return WORLD.world
        return None
    if isinstance(group, TorchCommsGroup):
        if group.default_comm.is_finalized():
            raise CommStateError(
                f"{what}: process group {group.group_name!r} was destroyed; create a new one"
            )
        return group
    return None


def _store(init_method: Any, store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    if store is not None:
        return store
    if init_method in (None, "env://"):
        addr = os.environ.get(_env.MASTER_ADDR) or "localhost"
        port_text = os.environ.get(_env.MASTER_PORT) or "29500"
        try:
            port = int(port_text)
        except ValueError:
            raise BootstrapError(f"{_env.MASTER_PORT}={port_text!r} is not a port number") from None
        return TCPStore(addr, port, size, rank == 0, timeout)
    from torch.distributed.rendezvous import rendezvous

    got, _, _ = next(rendezvous(init_method, rank, size, timeout=timeout))
    return got


def init_torchcomms(
    backend: Any,
    init_method: Any,
    timeout: timedelta | None,
    world_size: int,
    rank: int,
    store: Any,
    group_name: str,
    pg_options: Any,
) -> None:
    """``init_process_group(..., use_torchcomms=True)``: one communicator per device type."""
    if torchcomms_mode() or dist.is_initialized():
        raise CommStateError(
            "init_process_group: already initialised; call destroy_process_group() first"
        )
    pairs = parse_backend(backend)
    rank, size = rank_and_size(rank, world_size)
    if timeout is None:
        timeout = _env.default_timeout()
    root = _store(init_method, store, rank, size, timeout)
    hints: dict[str, str] = {}
    if pg_options is not None:
        high = getattr(pg_options, "is_high_priority_stream", None)
        if isinstance(high, bool):
            hints["is_high_priority_stream"] = "true" if high else "false"
        else:
            warnings.warn(
                "init_process_group(use_torchcomms=True): pg_options has no "
                "is_high_priority_stream; its other settings do not apply to torchcomms "
                "communicators (pass backend hints through torchcomms.new_comm instead)",
                stacklevel=3,
            )
    incarnation = next(WORLD.inits)
    comms: dict[str, TorchComm] = {}
    context = GroupContext(rank, size, timeout, tuple(range(size)), group_name or None)
    try:
        for device, name in pairs.items():
            if device == "cuda" and not torch.cuda.is_available():
                continue  # as torch.distributed does for "cpu:gloo,cuda:nccl" without GPUs
            prefix = PrefixStore(f"distwrap/{incarnation}/{device}/", root)
            with given_group(context):
                comms[device] = new_comm(
                    name,
                    torch.device(device),
                    name=group_name or f"default_torchcomm_{name}",
                    store=prefix,
                    timeout=timeout,
                    hints=dict(hints) or None,
                )
    except BaseException:
        for comm in comms.values():
            comm.finalize()
        raise
    if not comms:
        raise CommInputError(
            f"init_process_group: backend {backend!r} names only CUDA backends and this "
            f"process sees no CUDA device; use a CPU backend such as 'gloo'"
        )
    pg = TorchCommsGroup(comms, list(range(size)), group_name or "default_pg")
    _register(pg, root, default=True)
    with WORLD.lock:
        WORLD.use_torchcomms = True
        WORLD.world = pg
        WORLD.groups = [pg]


def _register(pg: TorchCommsGroup, store: Any, *, default: bool) -> None:
    """Enter ``pg`` into ``torch.distributed``'s maps (its default group if ``default``)."""
    backend = pg.getBackendName()
    c10d._register_pg_in_world(
        pg,
        backend_name=backend,
        store=store,
        group_name=c10d.GroupName(pg.group_name),
        backend_config=backend,
        rank_mapping={g: i for i, g in enumerate(pg.global_ranks)},
        add_to_default_tag=default,
    )
    if default:
        c10d._update_default_pg(pg)


def destroy(group: Any) -> None:
    """``destroy_process_group`` in torchcomms mode (every group, or one)."""
    if group is None or group is dist.GroupMember.WORLD or group is WORLD.world:
        groups = list(reversed(WORLD.groups))
        with WORLD.lock:
            WORLD.use_torchcomms = False
            WORLD.world = None
            WORLD.groups = []
        if dist.is_initialized():
            dist.destroy_process_group()  # shuts each registered group down
        for pg in groups:  # and those torch.distributed did not know (non-members)
            pg.shutdown()
        return
    if not isinstance(group, TorchCommsGroup):
        raise CommTypeError(
            f"destroy_process_group: {group!r} is not a group of this torchcomms world"
        )
    dist.destroy_process_group(group)
    with WORLD.lock:
        if group in WORLD.groups:
            WORLD.groups.remove(group)


def split(
    parent: TorchCommsGroup,
    split_ranks: list[list[int]],
    timeout: timedelta | None,
    group_desc: str | None,
    backend: Any,
) -> TorchCommsGroup | None:
    """``split_group`` in torchcomms mode: every parent member takes part."""
    if not isinstance(split_ranks, (list, tuple)) or not split_ranks:
        raise CommInputError(
            "split_group: split_ranks must be a non-empty list of lists of group ranks, "
            "e.g. [[0, 1], [2, 3]]"
        )
    me = parent.default_comm.get_rank()
    mine: list[int] = []
    seen: set[int] = set()
    for i, ranks in enumerate(split_ranks):
        if not isinstance(ranks, (list, tuple)) or not all(
            isinstance(r, int) and not isinstance(r, bool) for r in ranks
        ):
            raise CommTypeError(f"split_group: split_ranks[{i}] must be a list of ints")
        if seen.intersection(ranks):
            raise CommInputError(
                f"split_group: rank(s) {sorted(seen.intersection(ranks))} appear in more than "
                f"one list of split_ranks; each rank joins at most one group"
            )
        seen.update(ranks)
        if me in ranks:
            mine = sorted(ranks)
    devices = list(parent.comms)
    if backend is not None:
        wanted = parse_backend(backend)
        for device, name in wanted.items():
            have = parent.comms.get(device)
            if have is None or have.get_backend() != name:
                raise CommInputError(
                    f"split_group: backend {backend!r} asks for {device}:{name}, which the "
                    f"parent group {parent.group_name!r} does not have"
                )
        devices = [d for d in devices if d in wanted]
    parent.split_count += 1
    name = group_desc or f"{parent.group_name}:split:{parent.split_count}"
    children: dict[str, TorchComm] = {}
    for device in devices:
        child = parent.comms[device].split(mine, name)
        if child is not None:
            if timeout is not None:
                child.set_timeout(timeout)
            children[device] = child
    if not children:
        return None
    pg = TorchCommsGroup(children, [parent.global_ranks[r] for r in mine], name)
    _register(pg, None, default=False)
    with WORLD.lock:
        WORLD.groups.append(pg)
    return pg

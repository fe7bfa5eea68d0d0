"""Bootstrap: rank, world size and the rendezvous store from the launcher's environment.

Precedence of rank/size sources: TORCHCOMM_RANK/SIZE, torchrun, OpenMPI, SLURM, PMI.
The store comes from MASTER_ADDR/MASTER_PORT: torchrun's agent store when it says so,
otherwise rank 0 hosts a ``TCPStore``. One store per process serves every communicator.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

from . import _env
from .errors import BootstrapError

_store_lock = threading.Lock()
# The process-wide rendezvous store, keyed by (addr, port); every communicator made
# without an explicit store shares it under its own prefix.
_stores: dict[tuple[str, int], Any] = {}


def resolve_rank_size() -> tuple[int, int, str]:
    """Return ``(rank, size, source)`` or raise a :class:`BootstrapError` that says what to set."""
    try:
        found = _env.rank_and_size()
    except ValueError as exc:
        raise BootstrapError(str(exc)) from None
    if found is None:
        tried = ", ".join(f"{r}/{s}" for r, s, _ in _env.LAUNCHER_RANK_SIZE)
        raise BootstrapError(
            f"cannot tell this process's rank and world size: none of {tried} are set. "
            f"Launch with torchrun (e.g. `torchrun --nproc-per-node 2 script.py`), mpiexec "
            f"(`mpiexec -n 2 python script.py`, needed by the mpi backend) or srun, or set "
            f"TORCHCOMM_RANK and TORCHCOMM_SIZE"
        )
    return found


def default_store(rank: int, size: int, timeout: timedelta, required: bool = True) -> Any:
    """Return the process's rendezvous store, creating it on first use.

    With ``required=False`` (engines such as MPI that rendezvous by themselves) and no
    ``MASTER_ADDR``/``MASTER_PORT``, a store local to this process stands in.
    """
    from torch.distributed import HashStore, PrefixStore, TCPStore

    try:
        addr_port = _env.master_addr_port()
    except ValueError as exc:
        raise BootstrapError(str(exc)) from None
    if addr_port is None and not required:
        with _store_lock:
            local = _stores.get(("", 0))
            if local is None:
                local = _stores[("", 0)] = HashStore()
            return local
    if addr_port is None:
        raise BootstrapError(
            f"no rendezvous store: {_env.MASTER_ADDR} and {_env.MASTER_PORT} must be set "
            f"(torchrun sets them), or pass store=... to new_comm"
        )
    with _store_lock:
        store = _stores.get(addr_port)
        if store is not None:
            return store
        addr, port = addr_port
        agent = _env.use_agent_store()
        try:
            tcp = TCPStore(addr, port, size, is_master=(rank == 0 and not agent),
                           timeout=timeout, wait_for_workers=False, multi_tenant=True)
        except Exception as exc:
            role = "connect to" if agent or rank != 0 else "host"
            raise BootstrapError(
                f"could not {role} the rendezvous store at {addr}:{port} (rank {rank} of "
                f"{size}): {exc}. Check {_env.MASTER_ADDR}/{_env.MASTER_PORT} and that rank 0 "
                f"is running"
            ) from exc
        store = PrefixStore(f"torchcomms/attempt_{_env.restart_count()}", tcp)
        _stores[addr_port] = store
        return store

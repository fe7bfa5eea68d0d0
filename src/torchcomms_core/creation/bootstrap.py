"""Bootstrap: rank, world size and the rendezvous store from the launcher's environment.

Precedence of rank/size sources: TORCHCOMM_RANK/SIZE, torchrun, OpenMPI, SLURM, PMI.
The store comes from MASTER_ADDR/MASTER_PORT: torchrun's agent store when it says so,
otherwise rank 0 hosts a ``TCPStore`` listening only on the address MASTER_ADDR names;
``TORCHCOMM_STORE_PATH`` selects a ``FileStore`` instead (single host). One store per
process serves every communicator.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import threading
import warnings
from datetime import timedelta
from typing import Any

from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import BootstrapError

_store_lock = threading.Lock()
# The process-wide rendezvous store, keyed by (addr, port); every communicator made
# without an explicit store shares it under its own prefix.
_stores: dict[tuple[str, int], Any] = {}
# The ids of the stores in _stores whose server this process hosts.
_hosted: set[int] = set()


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
    from torch._C._distributed_c10d import HashStore, PrefixStore

    path = _env.store_file()
    if path is not None:
        return _file_store(path)
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
        if port == 0:
            # Port 0 asks for any free port, which only this process would know: a job of
            # one rank needs no peer to find it (the reference's unit tests run so), a
            # larger one cannot rendezvous there.
            if size != 1:
                raise BootstrapError(
                    f"{_env.MASTER_PORT}=0 names no port the other {size - 1} rank(s) could "
                    f"reach; set it to the port rank 0's store listens on (torchrun sets it)"
                )
            store = _stores[addr_port] = HashStore()
            return store
        agent = _env.use_agent_store()
        try:
            tcp = _tcp_store(addr, port, size, rank == 0 and not agent, timeout)
        except BootstrapError:
            raise
        except Exception as exc:
            role = "connect to" if agent or rank != 0 else "host"
            raise BootstrapError(
                f"could not {role} the rendezvous store at {addr}:{port} (rank {rank} of "
                f"{size}): {exc}. Check {_env.MASTER_ADDR}/{_env.MASTER_PORT} and that rank 0 "
                f"is running"
            ) from exc
        store = PrefixStore(f"torchcomms/attempt_{_env.restart_count()}", tcp)
        _stores[addr_port] = store
        if rank == 0 and not agent:
            _hosted.add(id(store))
        return store


def hosts_store(store: Any) -> bool:
    """Whether this process hosts the server of ``store`` (a store :func:`default_store`
    returned, or one signing over it): when it exits, every other rank loses the store."""
    inner = getattr(store, "inner", store)
    with _store_lock:
        return id(inner) in _hosted and any(s is inner for s in _stores.values())


def _file_store(path: str) -> Any:
    """The process's store over the file ``TORCHCOMM_STORE_PATH`` names (single-host jobs)."""
    from torch._C._distributed_c10d import FileStore, PrefixStore

    key = (path, -1)
    with _store_lock:
        store = _stores.get(key)
        if store is not None:
            return store
        try:
            files = FileStore(path, -1)
        except Exception as exc:
            raise BootstrapError(
                f"could not open the rendezvous file {_env.STORE_PATH}={path!r}: {exc}. Point it "
                f"at a file in a folder every rank of this host can write, or unset it to "
                f"rendezvous over {_env.MASTER_ADDR}/{_env.MASTER_PORT}"
            ) from exc
        store = _stores[key] = PrefixStore(f"torchcomms/attempt_{_env.restart_count()}", files)
        return store


#: Descriptors a store host keeps for itself beyond one connection per rank.
_SPARE_FILES = 64


def check_open_files(clients: int, what: str) -> None:
    """Make sure this process may open a connection per client, or say how to allow it.

    A store host holds one connection per rank; past the open-file limit the ranks
    beyond it hang or fail in ways that do not name the cause. The soft limit is raised
    up to the hard one when that is enough.
    """
    try:
        import resource
    except ImportError:  # not POSIX: the platform's own limits apply
        return
    need = clients + _SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard == resource.RLIM_INFINITY or hard >= need:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
            return
        except (OSError, ValueError):
            pass
    raise BootstrapError(
        f"{what} needs a connection per rank: {clients} ranks, but this process may open "
        f"only {soft} files (hard limit {hard}); raise the limit before starting it, e.g. "
        f"`ulimit -n {need}` in the launching shell (the hard limit needs root or "
        f"/etc/security/limits.conf), or run fewer ranks"
    )


def _tcp_store(addr: str, port: int, size: int, host: bool, timeout: timedelta) -> Any:
    """Connect to the TCP store, or host it listening only where ``MASTER_ADDR`` points."""
    from torch._C._distributed_c10d import TCPStore

    if host:
        check_open_files(size, f"the rendezvous store at {addr}:{port} (hosted by rank 0)")
    fd = _listen_fd(addr, port) if host else None
    if fd is None:
        return TCPStore(
            addr,
            port,
            size,
            is_master=host,
            timeout=timeout,
            wait_for_workers=False,
            multi_tenant=True,
        )
    return store_on_socket(fd, addr, port, size, timeout, multi_tenant=True)


def store_on_socket(
    fd: int, addr: str, port: int, size: int | None, timeout: timedelta, **options: Any
) -> Any:
    """A ``TCPStore`` server on the listening socket ``fd`` (closed if the store fails).

    ``size``: the ranks it waits for, ``None`` for any; ``options``: more ``TCPStore``
    keywords. The store does not wait for its clients to start.
    """
    from torch._C._distributed_c10d import TCPStore

    try:
        return TCPStore(
            addr,
            port,
            size,
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=fd,
            **options,
        )
    except Exception:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def _listen_fd(addr: str, port: int) -> int | None:
    """A socket listening on ``addr`` (or ``TORCHCOMM_STORE_LISTEN_ADDR``), handed to TCPStore.

    ``None`` leaves TCPStore to listen on every interface: asked for with ``*``, or when
    ``MASTER_ADDR`` resolves to nothing this host can listen on for the other hosts.
    """
    listen = _env.store_listen_addr()
    if listen in ("*", "0.0.0.0", "::"):
        return None
    target = listen or addr
    what = f"{_env.STORE_LISTEN_ADDR}={listen!r}" if listen else f"{_env.MASTER_ADDR}={addr!r}"
    try:
        infos = socket.getaddrinfo(target, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        if listen:
            raise BootstrapError(
                f"{what} does not resolve ({exc}); set it to an address of "
                f"this host, or '*' to listen on every interface"
            ) from None
        return None  # TCPStore reports the unresolvable MASTER_ADDR itself
    ips = sorted({str(info[4][0]) for info in infos})  # an IP address (str) for inet families
    if (
        not listen
        and target != "localhost"
        and not _is_ip(target)
        and all(ipaddress.ip_address(ip.split("%")[0]).is_loopback for ip in ips)
    ):
        # A host name that maps to 127.0.1.1 in /etc/hosts: binding there would lock out
        # the ranks on other hosts, which resolve the name to a routable address.
        warnings.warn(
            f"torchcomms: {what} resolves to {', '.join(ips)} on this host, a loopback address "
            f"other hosts cannot reach, so the rendezvous store listens on every interface. "
            f"Set {_env.MASTER_ADDR} to this host's address on the cluster network (or "
            f"{_env.STORE_LISTEN_ADDR}) to listen on one interface only",
            RuntimeWarning,
            stacklevel=4,
        )
        return None
    failure: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError as exc:  # e.g. IPv6 disabled in this kernel
            failure = exc
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(socket.SOMAXCONN)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                return None  # TCPStore shares a server this process already hosts, or explains
            failure = exc
            continue
        return sock.detach()
    if listen:
        raise BootstrapError(
            f"the rendezvous store cannot listen on {what} port {port} "
            f"({failure}); set it to an address of this host, or '*' to "
            f"listen on every interface"
        )
    warnings.warn(
        f"torchcomms: {what} ({', '.join(ips)}) is not an address of this host ({failure}), so "
        f"the rendezvous store listens on every interface. Set {_env.STORE_LISTEN_ADDR} to the "
        f"address of this host that the other ranks reach it through",
        RuntimeWarning,
        stacklevel=4,
    )
    return None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return False
    return True

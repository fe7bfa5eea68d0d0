"""Init handles that carry their own rendezvous, for ``new_comm(..., enable_reconfigure=True)``.

A reconfigurable communicator made without ``store=`` hosts a small ``TCPStore`` of its own
and names it in its handle, ``<backend>:<rank>:<token>:<host>:<port>``, so members of a new
quorum need nothing but the list of handles: they meet in the store of the first handle.
With ``store=`` the handle is ``<backend>:<rank>:<token>`` and members meet in that store.

``rank`` is the process's launcher rank at creation (0 without a launcher) and is only
informational; ``token`` is unique per communicator, so many communicators of one name in
one process never share a rendezvous.
"""

from __future__ import annotations

import errno
import socket
import time
import uuid as _uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from torchcomms_core.creation.bootstrap import store_on_socket
from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import CommInputError, CommOperationError, CommTimeoutError


@dataclass(frozen=True)
class Handle:
    """A parsed init handle; ``host`` is ``None`` for store-based handles."""

    backend: str
    rank: int
    token: str
    host: str | None = None
    port: int = 0

    def __str__(self) -> str:
        head = f"{self.backend}:{self.rank}:{self.token}"
        if self.host is None:
            return head
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{head}:{host}:{self.port}"

    @property
    def address(self) -> str:
        """``host:port`` of the rendezvous this handle names."""
        return str(self).split(":", 3)[3]


def new_token() -> str:
    """A fresh, unique token for one communicator."""
    return _uuid.uuid4().hex


def launcher_rank() -> int:
    """The launcher's rank of this process (0 when no launcher set one)."""
    try:
        found = _env.rank_and_size()
    except ValueError:
        return 0
    return found[0] if found is not None else 0


def _form(backend: str, hosted: bool) -> str:
    return f"{backend}:<rank>:<token>" + (":<host>:<port>" if hosted else "")


def parse_handle(text: Any, backend: str, hosted: bool, where: str) -> Handle:
    """Parse a handle of this ``backend``'s kind, or raise an error naming it and the form."""
    if not isinstance(text, str) or not text:
        raise CommInputError(
            f"{where} must be a handle string from get_init_handle(), got {text!r}"
        )
    kind = "names its own rendezvous" if hosted else "uses the store given to new_comm"
    parts = text.split(":", 3)
    if len(parts) >= 3 and parts[0] and parts[0] != backend and parts[1].lstrip("-").isdigit():
        raise CommInputError(
            f"{where} {text!r} comes from a {parts[0]!r} communicator, but this one runs on "
            f"{backend!r}; every member of a group must use the same backend"
        )
    bad = CommInputError(
        f"{where} {text!r} is not a handle from get_init_handle() of a {backend!r} "
        f"communicator; expected {_form(backend, hosted)!r} ({kind})"
    )
    if len(parts) < 3 or parts[0] != backend or not parts[2]:
        raise bad
    try:
        rank = int(parts[1])
    except ValueError:
        raise bad from None
    if len(parts) == 3:
        if hosted:
            raise CommInputError(
                f"{where} {text!r} belongs to a communicator created with store=, but this "
                f"one was created without a store and meets its members through their "
                f"handles; create every member the same way"
            )
        return Handle(backend, rank, parts[2])
    if not hosted:
        raise CommInputError(
            f"{where} {text!r} names its own rendezvous (a communicator created without "
            f"store=), but this one was created with store= and meets its members there; "
            f"create every member the same way"
        )
    host, _, port = parts[3].rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise bad
    return Handle(backend, rank, parts[2], host, int(port))


# -- hosting --------------------------------------------------------------------------------


#: The least time a store server's own client gets to connect to it while starting. The
#: connection is local and normally instant, but a loaded machine can delay the server's
#: thread for seconds; a short operation timeout (``new_comm(timeout=5 s)``) must not fail
#: the start. The store's operations then wait for the caller's timeout, not this.
HOST_START_FLOOR = timedelta(seconds=60)


def host_store(address: str | None, timeout: timedelta) -> tuple[Any, str, int]:
    """A ``TCPStore`` server of this process for one communicator: ``(store, host, port)``.

    ``address`` is where peers reach this process (the backend's choice: its interface or
    hostname); without one, the address this host's name resolves to (the one gloo's
    default device binds), else the loopback address. The store listens on that one
    address only, never on every interface, and the handle advertises the numeric address
    it listens on, so a peer never tries another address of this host.
    """
    start = max(timeout, HOST_START_FLOOR)
    fd, host, port = _listen(address if address is not None else default_address())
    store = store_on_socket(fd, host, port, None, start)
    store.set_timeout(timeout)
    return store, host, port


def default_address() -> str:
    """The address of this host's name that can be bound (gloo's default device does the
    same), else the loopback address, as gloo falls back too."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM)
    except OSError:
        return "127.0.0.1"
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind((sockaddr[0], 0) + tuple(sockaddr[2:]))
        except OSError:
            continue
        return str(sockaddr[0])
    return "127.0.0.1"


def _listen(address: str) -> tuple[int, str, int]:
    """A socket listening on ``address`` (any free port), as ``(fd, numeric host, port)``."""
    try:
        infos = socket.getaddrinfo(address, 0, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise CommInputError(
            f"new_comm: the rendezvous address {address!r} does not resolve ({exc}); name an "
            f"interface or hostname of this host"
        ) from None
    failure: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            failure = exc
            continue
        try:
            sock.bind(sockaddr)
            sock.listen(socket.SOMAXCONN)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        host, port = sock.getsockname()[:2]
        return sock.detach(), str(host), int(port)
    raise CommInputError(
        f"new_comm: cannot listen on {address!r} for the rendezvous ({failure}); it must be an "
        f"address of this host"
    )


# -- reaching a member's rendezvous ------------------------------------------------------------


def connect(handle: Handle, timeout: timedelta, where: str) -> Any:
    """A store client connected to the rendezvous ``handle`` names, within ``timeout``.

    A handle exists only once its rendezvous listens, so a refused connection means the
    member has exited: that fails at once, as does an unresolvable host; other errors
    (timeouts, unreachable networks) are retried until ``timeout``. The error names the
    handle and what was tried.
    """
    from torch._C._distributed_c10d import TCPStore

    assert handle.host is not None
    deadline = time.monotonic() + timeout.total_seconds()
    tried = 0
    pause = 0.02
    last: OSError | None = None
    while True:
        tried += 1
        left = deadline - time.monotonic()
        try:
            probe = socket.create_connection((handle.host, handle.port), timeout=max(left, 0.05))
        except socket.gaierror as exc:
            raise CommOperationError(
                f"{where}: cannot reach the rendezvous of handle {str(handle)!r}: host "
                f"{handle.host!r} does not resolve ({exc}); that member's host must be "
                f"reachable from here. Reconfigure with a new uuid and a list whose first "
                f"handle is a live, reachable member"
            ) from None
        except OSError as exc:
            last = exc
            if exc.errno == errno.ECONNREFUSED or time.monotonic() + pause >= deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.25)
            continue
        ip = str(probe.getpeername()[0])  # the address that answered: no second lookup
        probe.close()
        left = deadline - time.monotonic()
        try:
            return TCPStore(
                ip,
                handle.port,
                None,
                False,
                timedelta(seconds=max(left, 1.0)),
                wait_for_workers=False,
            )
        except Exception as exc:  # connected, but no store answered (in time) there
            store_error = exc
            if time.monotonic() + pause >= deadline:
                raise CommOperationError(
                    f"{where}: cannot reach the rendezvous of handle {str(handle)!r} at "
                    f"{handle.address} ({ip}): {store_error}. Reconfigure with a new uuid and "
                    f"a list whose first handle is a live member"
                ) from None
            time.sleep(pause)
    tail = ". Reconfigure with a new uuid and a list whose first handle is a live member"
    if last is not None and last.errno == errno.ECONNREFUSED:
        raise CommOperationError(
            f"{where}: cannot reach the rendezvous of handle {str(handle)!r} (the first of "
            f"init_handles) at {handle.address}: connection refused, so nothing listens there "
            f"any more and that member has exited{tail}"
        )
    raise CommTimeoutError(
        f"{where}: cannot reach the rendezvous of handle {str(handle)!r} (the first of "
        f"init_handles) at {handle.address} within {timeout}: {tried} attempts, last: {last}"
        f"{tail}"
    )


def has_exited(handle: Handle) -> bool:
    """Whether the member of ``handle`` is certainly gone: its rendezvous refuses connections."""
    if handle.host is None:
        return False
    try:
        socket.create_connection((handle.host, handle.port), timeout=0.2).close()
    except OSError as exc:
        return exc.errno == errno.ECONNREFUSED
    return False

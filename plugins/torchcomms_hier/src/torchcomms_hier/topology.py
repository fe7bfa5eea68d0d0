"""Who is on which host, and which backend each level runs: settings, the status exchange
and the :class:`Topology` every algorithm reads.

Before any level exists, every rank publishes what it resolved (host, local and global
backend, whether it can load them) in the communicator's store and reads everyone's. A bad
setting therefore fails on every rank with a message naming it, instead of leaving some
ranks waiting for a level that will never be created.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.plugin import (
    BackendLoadError,
    BackendNotFoundError,
    CommInputError,
    CommOperationError,
    CommTimeoutError,
    TorchCommBackend,
    get_backend_class,
    read_record,
)

from .codec import CODEC_HINT, CODEC_NONE, codec_unavailable_reason, parse_codec

#: Environment variable naming this process's host (default: the host name).
HOST_ID_ENV = "TORCHCOMM_HOST_ID"
#: Environment variable naming this host's local backend (the hint ``local_backend`` wins).
LOCAL_BACKEND_ENV = "TORCHCOMM_LOCAL_BACKEND"
#: The backend between hosts unless the hint ``global_backend`` names another.
DEFAULT_GLOBAL_BACKEND = "gloo"


@dataclasses.dataclass(frozen=True)
class Settings:
    """What this rank resolved from hints, environment and device."""

    host_id: str
    local_backend: str
    global_backend: str
    #: What crosses between hosts (hint ``global_codec``; see ``codec``).
    codec: str = CODEC_NONE


def default_local_backend(device: torch.device) -> str:
    """``shm`` for cpu when installed and able to run here (its ``is_available``), else
    ``gloo``; ``rccl``/``ncclx`` for cuda by the build."""
    if device.type == "cuda":
        return "rccl" if getattr(torch.version, "hip", None) else "ncclx"
    try:
        shm = get_backend_class("shm")
    except (BackendNotFoundError, BackendLoadError):
        return "gloo"
    return "shm" if shm.is_available()[0] else "gloo"


def resolve_settings(hints: dict[str, str], device: torch.device) -> Settings:
    """Host id, local and global backend of this rank (hints over environment over defaults)."""
    host = hints.get("host_id") or os.environ.get(HOST_ID_ENV, "").strip() or socket.gethostname()
    local = (
        hints.get("local_backend")
        or os.environ.get(LOCAL_BACKEND_ENV, "").strip()
        or default_local_backend(device)
    )
    codec = parse_codec(hints.get(CODEC_HINT))
    return Settings(host, local, hints.get("global_backend") or DEFAULT_GLOBAL_BACKEND, codec)


def _check_backend(name: str, device: torch.device, level: str) -> tuple[str, str, Any]:
    """``(kind, message, error)``: kind ``ok``, ``missing`` or ``unusable``."""
    try:
        cls: type[TorchCommBackend] = get_backend_class(name)
    except BackendNotFoundError as exc:
        return "missing", str(exc), exc
    except BackendLoadError as exc:
        return "unusable", str(exc), exc
    if name == "hier":
        exc2 = CommInputError(f"hier: the {level} level cannot be 'hier' itself; name an engine")
        return "unusable", str(exc2), exc2
    ok, reason = cls.is_available()
    if not ok:
        exc3 = BackendLoadError(f"backend {name!r} cannot run here: {reason}")
        return "unusable", str(exc3), exc3
    if level == "local" and device.type not in cls.devices:
        exc4 = CommInputError(
            f"local backend {name!r} runs on {', '.join(cls.devices)} devices, not "
            f"{device.type!r}; choose a local backend for {device.type}"
        )
        return "unusable", str(exc4), exc4
    return "ok", "", None


@dataclasses.dataclass(frozen=True)
class Topology:
    """The job's hosts in order (a host's index is its position; hosts are ordered by their
    smallest rank) and this rank's place in it."""

    rank: int
    #: The global ranks of each host, ascending.
    hosts: tuple[tuple[int, ...], ...]
    #: Each host's id (``TORCHCOMM_HOST_ID``, hint ``host_id`` or host name).
    host_ids: tuple[str, ...]
    #: Each host's local backend.
    local_backends: tuple[str, ...]
    #: The backend between hosts (the same on every rank).
    global_backend: str

    @property
    def nhosts(self) -> int:
        """Number of hosts."""
        return len(self.hosts)

    def locate(self, rank: int) -> tuple[int, int]:
        """``(host index, local index)`` of a global rank."""
        for h, members in enumerate(self.hosts):
            if rank in members:
                return h, members.index(rank)
        raise ValueError(f"rank {rank} is on no host")

    @property
    def host(self) -> int:
        """This rank's host index."""
        return self.locate(self.rank)[0]

    @property
    def local_rank(self) -> int:
        """This rank's index on its host."""
        return self.locate(self.rank)[1]

    @property
    def local_size(self) -> int:
        """Ranks on this rank's host."""
        return len(self.hosts[self.host])

    @property
    def even(self) -> bool:
        """Whether every host holds the same number of ranks (rails exist)."""
        return len({len(m) for m in self.hosts}) == 1

    def rank_of(self, host: int, local: int) -> int:
        """The global rank at ``local`` on ``host``."""
        return self.hosts[host][local]


#: The fields of a rank's status record, and their types (read_record checks them).
_STATUS_FIELDS = dict.fromkeys(
    ("host", "local", "global", "local_kind", "local_msg", "global_kind", "global_msg"), str
)


def exchange(
    store: Any,
    rank: int,
    size: int,
    timeout: timedelta,
    settings: Settings,
    device: torch.device,
    name: str,
) -> Topology:
    """Publish this rank's settings, read everyone's, refuse inconsistent or missing backends.

    Raises:
        CommInputError: ranks name different global backends or codecs, ranks of one host
            name different local backends (on every rank, naming both values), or this
            rank cannot run the codec (saying what to install).
        BackendNotFoundError, BackendLoadError: this rank's own backend cannot be loaded.
        CommOperationError: another host cannot load its backend or run the codec (naming
            host and backend or codec).
        CommTimeoutError: some rank did not publish its settings within ``timeout``.
    """
    local_kind, local_msg, local_err = _check_backend(settings.local_backend, device, "local")
    global_kind, global_msg, global_err = _check_backend(settings.global_backend, device, "global")
    mine = {
        "host": settings.host_id,
        "local": settings.local_backend,
        "global": settings.global_backend,
        "local_kind": local_kind,
        "local_msg": local_msg,
        "global_kind": global_kind,
        "global_msg": global_msg,
        "codec": settings.codec,
        "codec_msg": codec_unavailable_reason(settings.codec) or "",
    }
    store.set(f"hier/status/{rank}", json.dumps(mine))
    keys = [f"hier/status/{r}" for r in range(size)]
    try:
        store.wait(keys, timeout)
    except Exception as exc:
        missing = [r for r in range(size) if not store.check([keys[r]])]
        raise CommTimeoutError(
            f"hier communicator {name!r}: rank(s) {missing} did not report their host and "
            f"backends within {timeout} ({exc}); every rank must call new_comm('hier', ...) "
            f"with the same name"
        ) from None
    everyone = [read_record(store.get(k), k, _STATUS_FIELDS) for k in keys]
    where = f"hier communicator {name!r} (rank {rank})"
    for r, other in enumerate(everyone):
        if other["global"] != settings.global_backend:
            raise CommInputError(
                f"{where}: global_backend differs between ranks: rank {rank} names "
                f"{settings.global_backend!r}, rank {r} names {other['global']!r}; pass the "
                f"same hint global_backend on every rank"
            )
    for r, other in enumerate(everyone):
        if other["host"] == settings.host_id and other["local"] != settings.local_backend:
            raise CommInputError(
                f"{where}: ranks of host {settings.host_id!r} name different local backends: "
                f"rank {rank} names {settings.local_backend!r}, rank {r} names "
                f"{other['local']!r}; every rank of a host must use one local backend "
                f"(hint local_backend or {LOCAL_BACKEND_ENV})"
            )
    for r, other in enumerate(everyone):
        if other.get("codec") != settings.codec:
            raise CommInputError(
                f"{where}: {CODEC_HINT} differs between ranks: rank {rank} names "
                f"{settings.codec!r}, rank {r} names {other.get('codec')!r}; pass the same "
                f"hint {CODEC_HINT} on every rank"
            )
    if mine["codec_msg"]:
        raise CommInputError(f"{where}: {mine['codec_msg']}")
    for r, other in enumerate(everyone):
        if other["codec_msg"]:
            raise CommOperationError(
                f"{where}: host {other['host']!r} (rank {r}) cannot run the codec between "
                f"hosts: {other['codec_msg']}"
            )
    if local_err is not None:
        raise type(local_err)(
            f"{where}: the local level of host {settings.host_id!r} cannot use backend "
            f"{settings.local_backend!r}: {local_msg}"
        ) from local_err
    if global_err is not None:
        raise type(global_err)(
            f"{where}: the global level cannot use backend {settings.global_backend!r}: "
            f"{global_msg}"
        ) from global_err
    for r, other in enumerate(everyone):
        for level in ("local", "global"):
            if other[f"{level}_kind"] != "ok":
                raise CommOperationError(
                    f"{where}: host {other['host']!r} (rank {r}) cannot create its {level} "
                    f"level on backend {other[level]!r}: {other[f'{level}_msg']}. Install it "
                    f"on that host or choose another there (hint {level}_backend"
                    + (f" or {LOCAL_BACKEND_ENV})" if level == "local" else ")")
                )
    by_host: dict[str, list[int]] = {}
    for r, other in enumerate(everyone):
        by_host.setdefault(other["host"], []).append(r)
    ordered = sorted(by_host.items(), key=lambda item: item[1][0])
    return Topology(
        rank=rank,
        hosts=tuple(tuple(members) for _, members in ordered),
        host_ids=tuple(host for host, _ in ordered),
        local_backends=tuple(everyone[members[0]]["local"] for _, members in ordered),
        global_backend=settings.global_backend,
    )

"""Option objects: ``CommOptions`` for communicators, and the per-call option classes.

``CommOptions`` is what a backend's ``init`` receives; the core fills ``store``, ``rank``
and ``size`` from the bootstrap. The per-operation classes (``AllReduceOptions``, ...)
and ``BatchP2POptions`` carry a call's ``timeout`` and ``hints`` the reference's way.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from torchcomms_core.foundation import env as _env


@dataclasses.dataclass(eq=False)
class CommOptions:
    """Options of a communicator, as passed to ``TorchCommBackend.init``.

    ``CommOptions()`` takes its defaults from the environment like the reference:
    ``abort_process_on_timeout_or_error`` from ``TORCHCOMM_ABORT_ON_ERROR`` (true) and
    ``timeout`` from ``TORCHCOMM_TIMEOUT_SECONDS`` (600 s).
    """

    #: Abort the process when an operation fails or times out (``new_comm``'s argument).
    abort_process_on_timeout_or_error: bool = dataclasses.field(default_factory=_env.abort_on_error)
    #: The communicator's default timeout for operations.
    timeout: timedelta = dataclasses.field(default_factory=_env.default_timeout)
    #: The c10d ``Store`` the ranks rendezvous on, set by the core's bootstrap.
    store: Any = None
    #: The communicator's name (``new_comm``'s ``name``, or the generated one).
    name: str = ""
    #: ``True`` for a communicator created unbound, waiting for ``TorchComm.reconfigure``.
    enable_reconfigure: bool = False
    #: The communicator's hints (``new_comm``'s ``hints``), passed with every call as well.
    hints: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Communicator-local rank, resolved by the core's bootstrap (-1 until then).
    rank: int = -1
    #: Communicator size, resolved by the core's bootstrap (-1 until then).
    size: int = -1
    #: The communicator's ``spec.tuning.Tuning``, made by the core before ``init``
    #: (``TorchCommBackend._bind`` takes it as ``self.tuning``); ``None``: default rules.
    tuning: Any = None

    def replace(self, **changes: Any) -> CommOptions:
        """A copy with the given fields changed (``dataclasses.replace``).

        Raises:
            TypeError: a keyword that is not a field.
        """
        return dataclasses.replace(self, **changes)


class CallOptions:
    """``timeout`` and ``hints`` of one call; ``timeout`` zero or ``None`` = the comm's."""

    __slots__ = ("timeout", "hints")

    def __init__(
        self, timeout: timedelta | None = None, hints: dict[str, str] | None = None
    ) -> None:
        #: The call's timeout; zero means the communicator's default.
        self.timeout = timeout if timeout is not None else timedelta(0)
        #: The call's hints, passed to the backend with the communicator's.
        self.hints = dict(hints) if hints else {}

    def resolved(self) -> tuple[timedelta | None, dict[str, str] | None]:
        """``(timeout, hints)`` as an operation takes them: unset values become ``None``."""
        timeout = self.timeout if self.timeout else None
        return timeout, (self.hints or None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(timeout={self.timeout!r}, hints={self.hints!r})"


def _call_options(name: str) -> type[CallOptions]:
    return type(
        name,
        (CallOptions,),
        {"__slots__": (), "__doc__": f"Per-call options of ``{name[:-7]}``: timeout, hints."},
    )


#: ``BatchSendRecv.issue(async_op, options=BatchP2POptions())``.
BatchP2POptions = _call_options("BatchP2POptions")
SendOptions = _call_options("SendOptions")
RecvOptions = _call_options("RecvOptions")
BroadcastOptions = _call_options("BroadcastOptions")
AllReduceOptions = _call_options("AllReduceOptions")
ReduceOptions = _call_options("ReduceOptions")
AllGatherOptions = _call_options("AllGatherOptions")
AllGatherSingleOptions = _call_options("AllGatherSingleOptions")
ReduceScatterOptions = _call_options("ReduceScatterOptions")
ReduceScatterSingleOptions = _call_options("ReduceScatterSingleOptions")
AllToAllOptions = _call_options("AllToAllOptions")
AllToAllSingleOptions = _call_options("AllToAllSingleOptions")
AllToAllvSingleOptions = _call_options("AllToAllvSingleOptions")
BarrierOptions = _call_options("BarrierOptions")
ScatterOptions = _call_options("ScatterOptions")
GatherOptions = _call_options("GatherOptions")
AllGatherPInitOptions = _call_options("AllGatherPInitOptions")
AllGatherPExecOptions = _call_options("AllGatherPExecOptions")

OPERATION_OPTIONS: tuple[type[CallOptions], ...] = (
    SendOptions,
    RecvOptions,
    BroadcastOptions,
    AllReduceOptions,
    ReduceOptions,
    AllGatherOptions,
    AllGatherSingleOptions,
    ReduceScatterOptions,
    ReduceScatterSingleOptions,
    AllToAllOptions,
    AllToAllSingleOptions,
    AllToAllvSingleOptions,
    BarrierOptions,
    ScatterOptions,
    GatherOptions,
    AllGatherPInitOptions,
    AllGatherPExecOptions,
)


class Timeout(timedelta):
    """A ``datetime.timedelta`` the reference names for timeouts; any timedelta is accepted."""

    __slots__ = ()


#: An opaque per-rank handle of a communicator, exchanged out of band (``get_init_handle``).
InitHandle = str


class ReconfigureOptions:
    """Arguments of ``TorchComm.reconfigure``: ``uuid``, ``init_handles``, ``timeout``,
    ``hints``."""

    __slots__ = ("uuid", "init_handles", "timeout", "hints")

    def __init__(
        self,
        uuid: int = 0,
        init_handles: list[str] | set[str] | None = None,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> None:
        #: Names this reconfiguration; the same on every member, a new one each time.
        self.uuid = uuid
        #: The ``get_init_handle()`` values of the members, this rank's included.
        self.init_handles = init_handles if init_handles is not None else []
        #: How long to wait for every member (``None`` means the communicator's timeout).
        self.timeout = timeout
        #: Hints for this reconfiguration, over the communicator's own.
        self.hints = dict(hints) if hints else {}

    def __repr__(self) -> str:
        return (
            f"ReconfigureOptions(uuid={self.uuid!r}, init_handles={self.init_handles!r}, "
            f"timeout={self.timeout!r}, hints={self.hints!r})"
        )

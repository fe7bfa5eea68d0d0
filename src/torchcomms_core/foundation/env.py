"""Every environment variable torchcomms reads, in one place.

Names follow Meta's torchcomms where it defines one; new ones take ``TORCHCOMM_``.
"""

from __future__ import annotations

import math
import os
import threading
from datetime import timedelta

#: Default operation timeout in seconds (Meta's torchcomms name).
TIMEOUT_SECONDS = "TORCHCOMM_TIMEOUT_SECONDS"
#: Rank and world size set explicitly for torchcomms (highest precedence).
RANK = "TORCHCOMM_RANK"
SIZE = "TORCHCOMM_SIZE"

#: Launcher variables read by the bootstrap, in order of precedence.
LAUNCHER_RANK_SIZE: tuple[tuple[str, str, str], ...] = (
    (RANK, SIZE, "torchcomms (TORCHCOMM_RANK/TORCHCOMM_SIZE)"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OpenMPI"),
    ("PMI_RANK", "PMI_SIZE", "PMI"),
    ("PALS_RANKID", "PALS_SIZE", "PALS"),
    ("RANK", "WORLD_SIZE", "torchrun (RANK/WORLD_SIZE)"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM"),
)
LOCAL_RANK_VARS: tuple[str, ...] = (
    "TORCHCOMM_LOCAL_RANK",
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_LOCALID",
    "MPI_LOCALRANKID",
)
#: Verify before each collective that all ranks issue the same call (debug; costs a round).
CHECK_COLLECTIVES = "TORCHCOMM_CHECK_COLLECTIVES"
#: Plugin loading: a kill switch for entry-point plugins, and an allow-list of their names.
DISABLE_PLUGIN_AUTOLOAD = "TORCHCOMM_DISABLE_PLUGIN_AUTOLOAD"
PLUGINS = "TORCHCOMM_PLUGINS"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
#: Network interface the gloo backend binds to (e.g. ``eth1``); unset: the host name's address.
GLOO_HOSTNAME = "TORCHCOMM_GLOO_HOSTNAME"
GLOO_INTERFACE = "TORCHCOMM_GLOO_INTERFACE"
#: gloo connects lazily (on first use) in communicators larger than this; default 64.
GLOO_LAZY_ABOVE = "TORCHCOMM_GLOO_LAZY_ABOVE"
#: The tuner plugin that chooses algorithms (``torchcomms.tuners``); ``none``: default rules.
TUNER = "TORCHCOMM_TUNER"
#: Where ``torchcomms tune`` writes, and communicators read, the tuning tables.
TUNING_DIR = "TORCHCOMM_TUNING_DIR"
#: This host's id (ranks with the same id share a host); unset: the host name.
HOST_ID = "TORCHCOMM_HOST_ID"
#: torchrun sets this when its agent hosts the rendezvous store.
USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"

DEFAULT_TIMEOUT = timedelta(seconds=600)
#: The longest timeout accepted anywhere: engines keep deadlines in 64-bit nanoseconds
#: and overflow far beyond it.
MAX_TIMEOUT = timedelta(days=365)


def default_timeout() -> timedelta:
    """Return the communicator timeout from ``TORCHCOMM_TIMEOUT_SECONDS`` (600 s if unset)."""
    raw = os.environ.get(TIMEOUT_SECONDS)
    if raw is None or raw == "":
        return DEFAULT_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(
            f"{TIMEOUT_SECONDS}={raw!r} is not a number; set it to the timeout in seconds, e.g. 600"
        ) from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(
            f"{TIMEOUT_SECONDS}={raw!r} must be a positive, finite number of seconds, e.g. 600"
        )
    if seconds > MAX_TIMEOUT.total_seconds():
        raise ValueError(
            f"{TIMEOUT_SECONDS}={raw!r} is longer than the longest supported timeout "
            f"({MAX_TIMEOUT.days} days = {int(MAX_TIMEOUT.total_seconds())} s); set a smaller value"
        )
    return timedelta(seconds=seconds)


#: How rank and size are found (Meta's torchcomms name): auto, mpi, pals or torchrun.
RANKSIZE_QUERY_METHOD = "TORCHCOMM_BOOTSTRAP_RANKSIZE_QUERY_METHOD"
_PALS_SIZE_VARS = ("PALS_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE")
_QUERY_METHODS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "mpi": (
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OpenMPI"),
        ("PMI_RANK", "PMI_SIZE", "PMI"),
    ),
    "pals": tuple(("PALS_RANKID", size, f"PALS (PALS_RANKID/{size})") for size in _PALS_SIZE_VARS),
    "torchrun": (("RANK", "WORLD_SIZE", "torchrun (RANK/WORLD_SIZE)"),),
}


def rank_size_sources() -> tuple[tuple[str, str, str], ...]:
    """The (rank variable, size variable, source) pairs to try, in order.

    ``TORCHCOMM_RANK``/``TORCHCOMM_SIZE`` always come first. Then, as
    ``TORCHCOMM_BOOTSTRAP_RANKSIZE_QUERY_METHOD`` says: ``mpi`` (OpenMPI, then PMI),
    ``pals``, ``torchrun``, or ``auto`` (default): all three in that order, then SLURM.
    """
    method = os.environ.get(RANKSIZE_QUERY_METHOD, "").strip().lower() or "auto"
    explicit = ((RANK, SIZE, "torchcomms (TORCHCOMM_RANK/TORCHCOMM_SIZE)"),)
    if method == "auto":
        return (
            explicit
            + _QUERY_METHODS["mpi"]
            + _QUERY_METHODS["pals"]
            + _QUERY_METHODS["torchrun"]
            + (("SLURM_PROCID", "SLURM_NTASKS", "SLURM"),)
        )
    if method not in _QUERY_METHODS:
        raise ValueError(
            f"{RANKSIZE_QUERY_METHOD}={method!r} is not a known method; use auto, mpi, pals "
            f"or torchrun"
        )
    return explicit + _QUERY_METHODS[method]


# A thread that plays a rank in a simulation (``torchcomms_core.testing.simulated_rank``).
_simulated = threading.local()


def simulate_rank(rank_size: tuple[int, int] | None) -> None:
    """Make this thread read ``rank_size`` as its launcher's rank and size (``None``: stop)."""
    _simulated.rank_size = rank_size


def rank_and_size() -> tuple[int, int, str] | None:
    """Return ``(rank, size, source)`` from the first launcher whose variables are set."""
    simulated = getattr(_simulated, "rank_size", None)
    if simulated is not None:
        return simulated[0], simulated[1], "a simulated rank (torchcomms_core.testing)"
    env = os.environ
    for rank_var, size_var, source in rank_size_sources():
        if env.get(rank_var, "") != "" and env.get(size_var, "") != "":
            try:
                rank, size = int(env[rank_var]), int(env[size_var])
            except ValueError:
                raise ValueError(
                    f"{rank_var}={env[rank_var]!r} and {size_var}={env[size_var]!r} must be "
                    f"integers (read from {source})"
                ) from None
            if rank == -1 and size == -1 and rank_var == RANK:
                continue  # the reference's "unset" value
            if size < 1 or not 0 <= rank < size:
                raise ValueError(
                    f"{rank_var}={rank} and {size_var}={size} from {source} are inconsistent: "
                    f"need 0 <= rank < size"
                )
            return rank, size, source
    return None


#: Default of ``CommOptions.abort_process_on_timeout_or_error`` (Meta's torchcomms name).
ABORT_ON_ERROR = "TORCHCOMM_ABORT_ON_ERROR"
_TRUE = frozenset(("1", "true", "yes", "y", "on"))
_FALSE = frozenset(("0", "false", "no", "n", "off"))


def parse_bool(raw: str) -> bool | None:
    """``True``/``False`` for 1/true/yes/y/on and 0/false/no/n/off (any case), else ``None``.

    The one reading of a boolean the project uses: variables, hints, handler parameters.
    """
    value = raw.strip().lower()
    return True if value in _TRUE else False if value in _FALSE else None


def flag(name: str, default: bool) -> bool:
    """Read a boolean variable (see :func:`parse_bool`); unset or empty = ``default``."""
    raw = os.environ.get(name, "")
    if raw.strip() == "":
        return default
    value = parse_bool(raw)
    if value is None:
        raise ValueError(
            f"{name}={raw!r} is not a boolean; use 1/true/yes/y/on or 0/false/no/n/off"
        )
    return value


def abort_on_error() -> bool:
    """Default of ``abort_process_on_timeout_or_error`` (``TORCHCOMM_ABORT_ON_ERROR``, true)."""
    return flag(ABORT_ON_ERROR, True)


def local_rank() -> int | None:
    """Return the node-local rank from the launcher, if it sets one."""
    for var in LOCAL_RANK_VARS:
        value = os.environ.get(var)
        if value not in (None, ""):
            return int(value)
    return None


def master_addr_port() -> tuple[str, int] | None:
    addr = os.environ.get(MASTER_ADDR)
    port = os.environ.get(MASTER_PORT)
    if not addr or not port:
        return None
    try:
        return addr, int(port)
    except ValueError:
        raise ValueError(f"{MASTER_PORT}={port!r} is not a port number") from None


def use_agent_store() -> bool:
    return parse_bool(os.environ.get(USE_AGENT_STORE, "")) is True


def restart_count() -> int:
    return int(os.environ.get(RESTART_COUNT, "0") or 0)


def check_collectives() -> bool:
    return flag(CHECK_COLLECTIVES, False)


def plugin_autoload_disabled() -> bool:
    return flag(DISABLE_PLUGIN_AUTOLOAD, False)


def plugin_allow_list() -> set[str] | None:
    """Entry-point plugin names to load, or ``None`` for all."""
    raw = os.environ.get(PLUGINS)
    if raw is None:
        return None
    return {name.strip() for name in raw.split(",") if name.strip()}


# -- PyTorch bridge ----------------------------------------------------------------------

#: File name prefix of flight-recorder dumps; the global rank is appended (Meta's name).
FR_DUMP_TEMP_FILE = "TORCHCOMM_FR_DUMP_TEMP_FILE"
#: ``pickle`` lets object collectives unpickle arbitrary objects (Meta's name).
SERIALIZATION = "TORCHCOMMS_SERIALIZATION"


def fr_dump_prefix() -> str:
    """Return the flight-recorder dump prefix (``<cache>/torch/comm_lib_trace_rank_`` if unset).

    ``<cache>`` is ``$XDG_CACHE_HOME``, else ``~/.cache``: a folder of this user, not a
    name in the shared temporary folder that another user could plant first.
    """
    raw = os.environ.get(FR_DUMP_TEMP_FILE)
    if raw:
        return raw
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "torch", "comm_lib_trace_rank_")


def serialization_allows_pickle() -> bool:
    """Tell whether ``TORCHCOMMS_SERIALIZATION`` opts object collectives into full pickle."""
    raw = os.environ.get(SERIALIZATION, "").strip().lower()
    if raw in ("", "weights_only"):
        return False
    if raw == "pickle":
        return True
    raise ValueError(
        f"{SERIALIZATION}={raw!r} is not understood; set it to 'pickle' to accept arbitrary "
        f"objects from peers or 'weights_only' (the default) to accept only tensors and "
        f"plain data"
    )


# -- torch.compile -----------------------------------------------------------------------

#: ``1`` routes collectives through ``torch.library`` custom ops so they compile (Meta's name).
PATCH_FOR_COMPILE = "TORCHCOMMS_PATCH_FOR_COMPILE"
#: ``1`` skips the minimum PyTorch version check of the compile path (Meta's name).
COMPILE_IGNORE_PYTORCH_VERSION_REQUIREMENT = "TORCHCOMMS_COMPILE_IGNORE_PYTORCH_VERSION_REQUIREMENT"


def patch_for_compile() -> bool:
    """Tell whether ``TORCHCOMMS_PATCH_FOR_COMPILE`` is exactly ``"1"``."""
    return os.environ.get(PATCH_FOR_COMPILE) == "1"


def compile_ignore_version_requirement() -> bool:
    """Tell whether the version check of the compile path is switched off (``"1"``)."""
    return os.environ.get(COMPILE_IGNORE_PYTORCH_VERSION_REQUIREMENT) == "1"


# -- hardening: object-collective limit, store exposure, backend name overrides ----------

#: Largest serialized payload one rank may declare in an object collective (bytes; K/M/G/T).
OBJCOL_MAX_BYTES = "TORCHCOMM_OBJCOL_MAX_BYTES"
DEFAULT_OBJCOL_MAX_BYTES = 2 << 30
#: Address the rank-0 rendezvous store listens on (default: the one ``MASTER_ADDR`` names).
STORE_LISTEN_ADDR = "TORCHCOMM_STORE_LISTEN_ADDR"
#: A ``FileStore`` path to rendezvous through instead of TCP (single-host jobs).
STORE_PATH = "TORCHCOMM_STORE_PATH"
#: A secret shared by every rank of a job: store entries are signed with it (docs/security.md).
JOB_TOKEN = "TORCHCOMM_JOB_TOKEN"
#: ``name=distribution,...``: let that distribution provide a built-in backend name.
BACKEND_OVERRIDE = "TORCHCOMM_BACKEND_OVERRIDE"

_BYTE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def objcol_max_bytes() -> int:
    """Return the object-collective payload limit from ``TORCHCOMM_OBJCOL_MAX_BYTES`` (2 GiB)."""
    raw = os.environ.get(OBJCOL_MAX_BYTES, "").strip()
    if not raw:
        return DEFAULT_OBJCOL_MAX_BYTES
    text = raw.upper().removesuffix("B").removesuffix("I")
    digits, suffix = (text[:-1], text[-1]) if text[-1:].isalpha() else (text, "")
    if suffix in _BYTE_SUFFIXES and digits.isdigit() and int(digits) > 0:
        return int(digits) * _BYTE_SUFFIXES[suffix]
    raise ValueError(
        f"{OBJCOL_MAX_BYTES}={raw!r} is not a size; set it to a positive number of bytes, "
        f"optionally with a K, M, G or T suffix (e.g. 4G)"
    )


def store_listen_addr() -> str | None:
    """The address set by ``TORCHCOMM_STORE_LISTEN_ADDR``, or ``None`` to follow MASTER_ADDR."""
    return os.environ.get(STORE_LISTEN_ADDR, "").strip() or None


def store_file() -> str | None:
    """The ``FileStore`` path set by ``TORCHCOMM_STORE_PATH``, if any."""
    return os.environ.get(STORE_PATH, "").strip() or None


def _name_pairs(var: str, value_kind: str, example: str) -> dict[str, str]:
    """``{name: value}`` from a variable of comma-separated ``name=value`` items."""
    raw = os.environ.get(var, "")
    out: dict[str, str] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(
                f"{var}={raw!r}: {item.strip()!r} is not name={value_kind}; write e.g. "
                f"{var}={example}"
            )
        out[name.strip()] = value.strip()
    return out


def backend_overrides() -> dict[str, str]:
    """Backend name -> distribution the user chose with ``TORCHCOMM_BACKEND_OVERRIDE``."""
    return _name_pairs(BACKEND_OVERRIDE, "distribution", "gloo=my-gloo-dist")


# -- shipped hooks: flight recorder and health check (Meta's names) ---------------------

#: Entries of the process-wide flight recorder (``<= 0`` disables it).
FR_BUFFER_SIZE = "TORCHCOMM_FR_BUFFER_SIZE"
DEFAULT_FR_BUFFER_SIZE = 2000
#: True: ``TORCHCOMM_FR_DUMP_TEMP_FILE`` is the whole dump file name (no rank appended).
FR_DUMP_DYNAMIC_FILE_NAME = "TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME"
#: Record C++ stacks. Accepted for compatibility; the Python engines have none to record.
FR_CPP_STACK = "TORCHCOMM_FR_CPP_STACK"
#: Milliseconds the flight recorder's abort hook waits before the process aborts.
HEALTH_CHECK_WAIT_MS = "TORCHCOMM_HEALTH_CHECK_WAIT_MS"
DEFAULT_HEALTH_CHECK_WAIT_MS = 15000


def _hook_int(name: str, default: int, example: str) -> int:
    raw = os.environ.get(name, "").strip()
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer; set it to e.g. {example}") from None


def fr_buffer_size() -> int:
    """Entries of the process-wide flight recorder (``TORCHCOMM_FR_BUFFER_SIZE``, 2000)."""
    return max(0, _hook_int(FR_BUFFER_SIZE, DEFAULT_FR_BUFFER_SIZE, "2000 (0 disables)"))


#: Register every installed torchcomms backend with ``torch.distributed`` at ``import torch``
#: (torch's device-backend autoload); ``0`` opts out, a comma-separated list of names
#: (``shm,hier``) registers only those.
C10D_AUTOLOAD = "TORCHCOMM_C10D_AUTOLOAD"


def c10d_autoload() -> bool:
    """Whether torch's autoload registers our backends with c10d (``TORCHCOMM_C10D_AUTOLOAD``,
    true; an unreadable value counts as true, since ``import torch`` must not fail on it)."""
    value = parse_bool(os.environ.get(C10D_AUTOLOAD, ""))
    return value is not False


def c10d_autoload_names() -> frozenset[str] | None:
    """The names ``TORCHCOMM_C10D_AUTOLOAD`` limits the autoload to (``shm,hier``), or
    ``None`` when it names none (every installed backend, or none when it opts out)."""
    raw = os.environ.get(C10D_AUTOLOAD, "").strip()
    if raw == "" or parse_bool(raw) is not None:
        return None
    names = frozenset(part.strip().lower() for part in raw.split(",") if part.strip())
    return names or None


#: c10d backend names served by another torchcomms backend while c10d creates a group
#: (``gloo=shm``), for code that hard-codes its backend string.
C10D_ALIASES = "TORCHCOMM_C10D_ALIASES"


def c10d_aliases() -> dict[str, str]:
    """``{c10d name: torchcomms backend}`` from ``TORCHCOMM_C10D_ALIASES`` (``gloo=shm``)."""
    return _name_pairs(C10D_ALIASES, "backend", "gloo=shm")


def c10d_recorder_entries() -> int:
    """The flight recorder size c10d asks for: ``TORCH_FR_BUFFER_SIZE``, else
    ``TORCH_NCCL_TRACE_BUFFER_SIZE`` (0: c10d records nothing)."""
    name = (
        "TORCH_FR_BUFFER_SIZE"
        if os.environ.get("TORCH_FR_BUFFER_SIZE", "").strip()
        else ("TORCH_NCCL_TRACE_BUFFER_SIZE")
    )
    return max(0, _hook_int(name, 0, "2000 (0 records nothing)"))


def fr_dump_dynamic_file_name() -> bool:
    """Whether ``TORCHCOMM_FR_DUMP_TEMP_FILE`` names the whole dump file (false)."""
    return flag(FR_DUMP_DYNAMIC_FILE_NAME, False)


def fr_cpp_stack() -> bool:
    """``TORCHCOMM_FR_CPP_STACK`` (false); validated, but no C++ stacks exist to record."""
    return flag(FR_CPP_STACK, False)


def health_check_wait_ms() -> int:
    """Milliseconds to wait before a failing process aborts (``TORCHCOMM_HEALTH_CHECK_WAIT_MS``)."""
    return max(0, _hook_int(HEALTH_CHECK_WAIT_MS, DEFAULT_HEALTH_CHECK_WAIT_MS, "15000"))


#: Which installed transport ``torchcomms._transport`` uses (a ``torchcomms.transports``
#: entry-point name such as ``nixl``); unset: the only one installed, or ``nixl`` among several.
TRANSPORT = "TORCHCOMM_TRANSPORT"


def transport_choice() -> str | None:
    """The transport named by ``TORCHCOMM_TRANSPORT``, or ``None`` when unset."""
    return os.environ.get(TRANSPORT, "").strip() or None


def tuner_choice() -> str | None:
    """``TORCHCOMM_TUNER``, stripped; ``None`` when unset or empty."""
    raw = os.environ.get(TUNER, "").strip()
    return raw or None


def tuning_dir() -> str:
    """``TORCHCOMM_TUNING_DIR``, else ``~/.cache/torchcomms/tuning`` (``XDG_CACHE_HOME``)."""
    raw = os.environ.get(TUNING_DIR, "").strip()
    if raw:
        return os.path.expanduser(raw)
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join("~", ".cache")
    return os.path.join(os.path.expanduser(cache), "torchcomms", "tuning")


def host_id() -> str:
    """``TORCHCOMM_HOST_ID``, else this machine's host name."""
    import socket

    return os.environ.get(HOST_ID, "").strip() or socket.gethostname()

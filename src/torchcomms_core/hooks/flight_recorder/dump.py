"""The flight recorder's dump format: c10d's trace layout, and the files it is written to.

Owns what a dump contains (:func:`render`: the fields of c10d's own flight recorder, so
PyTorch's analyzer ``torch.distributed.flight_recorder`` can match operations across
ranks), how groups are named in it (:func:`set_group_describer`: the c10d bridge installs
its lookup), and how dumps are written (:func:`write`, :func:`dump_path`: JSON, or pickle
as c10d writes it, to a private file).

May import :mod:`.entry`, ``foundation`` and ``comm`` (for the communicator's type); not
the ring or the hook, which build on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import tempfile
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import CommInputError
from torchcomms_core.hooks.flight_recorder.entry import (
    _ALGORITHM,
    _COLLECTIVE_SEQ,
    _COMPLETED,
    _CREATED,
    _FRAMES,
    _HERE,
    _INPUT,
    _IS_P2P,
    _KIND,
    _MAX_FRAMES,
    _ME,
    _ONE,
    _OP_SEQ,
    _OUTPUT,
    _P2P_SEQ,
    _PEER,
    _RECORD_ID,
    _RETIRED,
    _STACK,
    _STARTED,
    _STATE,
    _THREAD_ID,
    _THREAD_NAME,
    _TIMEOUT,
    _TRACK,
    RENDERED,
    _Desc,
)

try:  # the symbolizer of the stacks entry._frames captured
    from torch._C._profiler import symbolize_tracebacks as _symbolize_tracebacks
except ImportError:  # pragma: no cover - torch builds without the profiler bindings
    _symbolize_tracebacks = None  # type: ignore[assignment]


class Group(Protocol):
    """What a dump reads of a recorded communicator (the ring's track)."""

    pg_id: int
    comm: weakref.ref[TorchComm]


def _undescribed(comm: TorchComm) -> tuple[str, str, list[int] | None]:
    return comm.get_name(), "undefined", None


# ``(group name, description, global ranks or None)`` of a communicator as torch.distributed
# knows it. The c10d bridge, the only way a communicator becomes a c10d group, installs its
# lookup when it loads (``set_group_describer``); without it no group exists to describe.
_describe: Callable[[TorchComm], tuple[str, str, list[int] | None]] = _undescribed


def set_group_describer(describe: Callable[[TorchComm], tuple[str, str, list[int] | None]]) -> None:
    """Name dumped groups with ``describe(comm)`` (the c10d bridge installs its lookup)."""
    global _describe
    _describe = describe


#: The c10d flight-recorder format version our dumps follow.
VERSION = "2.10"

# Analyzer operation names for ours where they differ.
_PROFILING_NAMES = {"gather_single": "gather"}
_SCALAR_NAMES = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.int16: "Short",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.bool: "Bool",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
}


def _scalar_name(dtype: torch.dtype) -> str:
    return _SCALAR_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def _render(desc: _Desc) -> tuple[list[list[int]], list[str]]:
    """c10d's ``(sizes, dtypes)`` of a description made by ``entry._io``."""
    if desc is None:
        return [], []
    if desc[0] == _ONE:
        return [list(desc[1])], [_scalar_name(desc[2])]
    if desc[0] == RENDERED:  # c10d's own, for the engine lane (see the c10d bridge's recorder_lane)
        return [list(sizes) for sizes in desc[1]], list(desc[2])
    pairs = desc[1]
    if desc[0] == _STACK and pairs and len({shape for shape, _ in pairs}) == 1:
        return [[len(pairs), *pairs[0][0]]], [_scalar_name(pairs[0][1])]
    return [list(shape) for shape, _ in pairs], [_scalar_name(dtype) for _, dtype in pairs]


def _frame_lists(captured: list[Any]) -> list[list[dict[str, Any]]]:
    """c10d's ``frames`` (innermost first, at most 32, without torchcomms' own frames) of
    each stack ``entry._frames`` returned."""
    if _symbolize_tracebacks is None:
        return [[{"name": n, "filename": f, "line": ln} for n, f, ln in c] for c in captured]
    return [_kept_frames(frames) for frames in _symbolize_tracebacks(captured)]


def _kept_frames(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """c10d's ``frames`` of a symbolized stack: at most 32, without torchcomms' own."""
    here = _HERE
    kept = []
    for frame in frames:
        filename = frame["filename"]
        if not filename.startswith(here):
            kept.append({"name": frame["name"], "filename": filename, "line": frame["line"]})
            if len(kept) == _MAX_FRAMES:
                break
    return kept


def _thread_name(thread: threading.Thread | str) -> str:
    return thread if isinstance(thread, str) else thread.name


def _profiling_name(entry: list[Any]) -> str:
    kind = entry[_KIND]
    if kind == "send":
        label = f"send {entry[_ME]}->{entry[_PEER]}"
    elif kind == "recv":
        label = f"recv {entry[_ME]}<-{entry[_PEER]}"
    else:
        label = _PROFILING_NAMES.get(kind, kind)
    return f"{entry[_TRACK].backend}:{label}"


def dump_path(rank: int) -> str:
    """Where the dump of ``rank`` goes (``TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME`` decides)."""
    try:
        dynamic = _env.fr_dump_dynamic_file_name()
    except ValueError as exc:
        raise CommInputError(str(exc)) from None
    raw = os.environ.get(_env.FR_DUMP_TEMP_FILE, "")
    if dynamic and raw:
        return raw
    return f"{_env.fr_dump_prefix()}{rank}"


def global_rank(comms: list[TorchComm | None] = ()) -> int:  # type: ignore[assignment]
    """This process's global rank: torch.distributed's, the launcher's, else a comm's."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except RuntimeError:
        pass
    found = _env.rank_and_size()
    if found is not None:
        return found[0]
    for comm in comms:
        if comm is not None:
            return comm.get_rank()
    return 0


def _write_private(path: str, payload: bytes) -> None:
    """Write ``payload`` to ``path`` readable by this user only, never through a symlink.

    The bytes go to a fresh ``mkstemp`` file (``O_EXCL``, mode 0600, unpredictable name) in
    the target folder, which is then renamed over ``path``: a rename replaces a symlink
    planted at ``path`` instead of writing where it points. A missing folder is created
    private (0700).
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def ranks_str(ranks: Any) -> str:
    """A group's ranks as the reference's recorder writes them in ``pg_config``:
    ``"[0,1,2]"`` (torch 2.13's c10d recorder puts a space after each comma; readers such
    as ``fr_trace`` parse either)."""
    return "[" + ",".join(str(int(r)) for r in ranks) + "]"


def _fallback_ranks(comm: TorchComm) -> list[int]:
    # An unregistered communicator as large as the job uses the job's ranks; others
    # can only be described by their own ranks.
    return list(range(comm.get_size()))


def render(
    entries: list[list[Any]], groups: Sequence[Group], include_completed: bool
) -> dict[str, Any]:
    """c10d's dump of settled ``entries`` (oldest first) of the communicators ``groups``
    (``include_completed=False``: only the operations not yet completed)."""
    named, pg_config = _describe_groups(groups)
    pg_status: dict[str, dict[str, int]] = {}
    kept = []
    for entry in entries:
        state = entry[_STATE]
        if not entry[_IS_P2P]:
            status = pg_status.setdefault(
                str(entry[_TRACK].pg_id),
                {
                    "last_enqueued_collective": -1,
                    "last_started_collective": -1,
                    "last_completed_collective": -1,
                },
            )
            seq = entry[_COLLECTIVE_SEQ]
            status["last_enqueued_collective"] = seq
            if state in ("started", "completed"):
                status["last_started_collective"] = seq
            if state == "completed":
                status["last_completed_collective"] = seq
        if include_completed or state != "completed":
            kept.append(entry)
    frames = _entry_frames(kept)
    return {
        "version": VERSION,
        "comm_lib_version": "",
        "pg_config": pg_config,
        "pg_status": pg_status,
        "nccl_comm_state": {},
        "entries": [_record(e, f, named) for e, f in zip(kept, frames, strict=True)],
    }


def _describe_groups(
    groups: Sequence[Group],
) -> tuple[dict[int, tuple[str, str, Any]], dict[str, dict[str, str]]]:
    """Each live group's ``(name, description, ranks)`` by ``pg_id``, and c10d's
    ``pg_config``."""
    named: dict[int, tuple[str, str, Any]] = {}
    pg_config: dict[str, dict[str, str]] = {}
    for group in groups:
        comm = group.comm()
        if comm is None:
            continue
        name, desc, ranks = _describe(comm)
        if ranks is None:
            ranks = _fallback_ranks(comm)
        named[group.pg_id] = (name, desc, ranks)
        pg_config[name] = {"name": name, "desc": desc, "ranks": ranks_str(ranks)}
    return named, pg_config


def _entry_frames(kept: list[list[Any]]) -> list[list[dict[str, Any]]]:
    """c10d's frames of each entry: our own stacks, symbolized together, and those c10d
    recorded of the engine lane's calls."""
    frames: list[list[dict[str, Any]]] = [[] for _ in kept]
    own = []
    for i, entry in enumerate(kept):
        captured = entry[_FRAMES]
        if type(captured) is tuple and captured and captured[0] == RENDERED:
            frames[i] = _kept_frames(captured[1])
        else:
            own.append(i)
    for i, stack in zip(own, _frame_lists([kept[i][_FRAMES] for i in own]), strict=True):
        frames[i] = stack
    return frames


def _record(
    entry: list[Any], frames: list[dict[str, Any]], named: dict[int, tuple[str, str, Any]]
) -> dict[str, Any]:
    """c10d's dict of one entry."""
    pg_id = entry[_TRACK].pg_id
    inp, outp = entry[_INPUT], entry[_OUTPUT]
    in_sizes, in_types = _render(inp)
    out_sizes, out_types = (in_sizes, in_types) if outp is inp else _render(outp)
    timeout = entry[_TIMEOUT]
    name, desc, _ = named.get(pg_id, (str(pg_id), "undefined", []))
    record: dict[str, Any] = {
        "record_id": entry[_RECORD_ID],
        "pg_id": pg_id,
        "collective_seq_id": entry[_COLLECTIVE_SEQ],
        "p2p_seq_id": entry[_P2P_SEQ],
        "op_id": entry[_OP_SEQ],
        "profiling_name": _profiling_name(entry),
        "time_created_ns": entry[_CREATED],
        "input_sizes": in_sizes,
        "input_dtypes": in_types,
        "output_sizes": out_sizes,
        "output_dtypes": out_types,
        "state": entry[_STATE],
        "time_discovered_started_ns": entry[_STARTED],
        "time_discovered_completed_ns": entry[_COMPLETED],
        "retired": entry[_RETIRED],
        "timeout_ms": (int(timeout.total_seconds() * 1000) if timeout is not None else 0),
        "is_p2p": entry[_IS_P2P],
        "thread_id": str(entry[_THREAD_ID]),
        "thread_name": _thread_name(entry[_THREAD_NAME]),
        "frames": frames,
        "process_group": [name, desc],
    }
    if entry[_ALGORITHM] is not None:
        # The algorithm the backend chose (#45); c10d's records have no such field.
        record["algorithm"] = entry[_ALGORITHM]
    if entry[_STATE] == "completed" and entry[_COMPLETED] is not None:
        # c10d writes the field only once an operation completed (from its CUDA
        # events); here from the call to the completion the recorder saw.
        record["duration_ms"] = max(entry[_COMPLETED] - entry[_CREATED], 0) / 1e6
    return record


def write(path: str, data: dict[str, Any], format: str) -> None:
    """Write the dump ``data`` to ``path`` as JSON, or (``format="pickle"``) as c10d's own
    recorder writes it, readable by this user only."""
    if format == "json":
        payload = json.dumps(data).encode()
    else:
        for entry in data["entries"]:
            entry["process_group"] = tuple(entry["process_group"])
        payload = pickle.dumps(data)
    _write_private(path, payload)

"""The handlers PyTorch's debug server calls on every rank, by name.

``torch.distributed.debug`` asks each rank's worker server for
``/handler/torchcomms_fr_trace_json``, ``/handler/torchcomms_fr_dump_file`` and
``/handler/torchcomms_health_check``. :func:`register_debug_handlers` registers them with
``torch._C._distributed_c10d._register_handler`` (PyTorch 2.13 has it); each is also a
plain function of ``(request, response)``, where ``request.get_param(name)`` returns a
query parameter ("" if absent) and ``response`` has ``set_content`` and ``set_status``.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

from torchcomms_core.foundation.env import parse_bool

HANDLER_NAMES = ("torchcomms_fr_trace_json", "torchcomms_fr_dump_file", "torchcomms_health_check")


def _param(req: Any, name: str, default: bool) -> bool:
    raw = str(req.get_param(name) or "").strip()
    if raw == "":
        return default
    value = parse_bool(raw)
    if value is None:
        raise ValueError(f"parameter {name}={raw!r} must be true or false")
    return value


def _reply(resp: Any, status: int, body: Any, kind: str = "application/json") -> None:
    resp.set_content(body if isinstance(body, str) else json.dumps(body), kind)
    resp.set_status(status)


def torchcomms_health_check(req: Any, resp: Any) -> None:
    """``{"healthy": bool}``: false once an operation failed under a flight recorder."""
    from torchcomms_core.hooks.flight_recorder import is_healthy

    _reply(resp, 200, {"healthy": is_healthy()})


def torchcomms_fr_trace_json(req: Any, resp: Any) -> None:
    """The process-wide flight recorder as c10d's JSON trace.

    Parameters: ``includecollectives`` (default true; false leaves ``entries`` empty) and
    ``onlyactive`` (default false; true leaves out completed operations).
    """
    from torchcomms_core.hooks.flight_recorder import global_recorder

    try:
        collectives = _param(req, "includecollectives", True)
        only_active = _param(req, "onlyactive", False)
    except ValueError as exc:
        _reply(resp, 400, f"torchcomms_fr_trace_json: {exc}", "text/plain")
        return
    data = global_recorder().dump_dict(include_completed=not only_active)
    if not collectives:
        data["entries"] = []
    _reply(resp, 200, data)


def torchcomms_fr_dump_file(req: Any, resp: Any) -> None:
    """Write the process-wide recorder's dump file in the background (503 if it has no
    communicator yet)."""
    from torchcomms_core.hooks.flight_recorder import (
        FlightRecorderHook,
        dump_path,
        global_rank,
        global_recorder_in_use,
    )

    if not global_recorder_in_use():
        _reply(
            resp,
            503,
            "torchcomms_fr_dump_file: no communicator is registered with the "
            "process-wide flight recorder; register one with "
            "torchcomms.hooks.FlightRecorderHook().register_with_comm(comm)",
            "text/plain",
        )
        return
    hook = FlightRecorderHook()
    rank = global_rank([t.comm() for t in hook._recorder.tracks])
    path = dump_path(rank)

    def write() -> None:
        try:
            hook.dump_file(rank)
        except Exception as exc:  # reported, never raised into the server thread
            sys.stderr.write(f"torchcomms: flight recorder dump to {path} failed: {exc}\n")

    threading.Thread(target=write, name="torchcomms-fr-dump", daemon=True).start()
    _reply(resp, 200, f"dumping the flight recorder of rank {rank} to {path}", "text/plain")


_HANDLERS = {
    "torchcomms_fr_trace_json": torchcomms_fr_trace_json,
    "torchcomms_fr_dump_file": torchcomms_fr_dump_file,
    "torchcomms_health_check": torchcomms_health_check,
}


def _outlive_the_interpreter(fn: Any) -> Any:
    """Give ``fn`` one reference that is never released.

    PyTorch keeps registered handlers in a C++ table destroyed after the interpreter has
    shut down; if that table held the last reference, freeing the function then would
    abort the process ("PyThreadState_Get: ... the GIL is released") at exit.
    """
    import ctypes

    ctypes.pythonapi.Py_IncRef(ctypes.py_object(fn))
    return fn


def register_debug_handlers() -> list[str]:
    """Register the handlers with PyTorch's worker server; returns the names now ours.

    Returns an empty list where this PyTorch has no registration function. A name
    already registered (by an earlier import) is left as it is.
    """
    try:
        # torch's stub lacks _get_handler_names, which the extension module defines.
        from torch._C._distributed_c10d import (  # type: ignore[attr-defined]
            _get_handler_names,
            _register_handler,
        )
    except (ImportError, AttributeError):
        return []
    names = set(_get_handler_names())
    for name, fn in _HANDLERS.items():
        if name not in names:
            try:
                _register_handler(name, _outlive_the_interpreter(fn))
            except ValueError:  # registered concurrently
                pass
    return [n for n in HANDLER_NAMES if n in set(_get_handler_names())]

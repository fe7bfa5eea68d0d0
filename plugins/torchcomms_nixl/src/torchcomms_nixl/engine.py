"""Finding the NIXL wheel (``nixl_cu12``, what ``pip install nixl-cu12`` provides) and starting
an agent on its compiled bindings.

Imported lazily, so ``torchcomms transports`` can say why NIXL cannot load without failing.
The agent is made on the bindings rather than NIXL's ``nixl_agent`` wrapper because the
wrapper starts NIXL's progress thread polling without pause (two thirds of a core while
idle). The agent runs without that thread: NIXL then progresses UCX inside the calls that
look at transfers and notifications, which the thread that waits makes itself (a transfer
polls its status, a signal's waiter reads notifications), and the plugin's service thread
makes every ``PROGRESS_US`` for a target that is not waiting (UCX over TCP needs the target
to take part).
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any

#: Import names of NIXL's Python API, tried in order.
MODULES: tuple[str, ...] = ("nixl_cu12", "nixl_cu13", "nixl")


@functools.lru_cache(maxsize=1)
def _load() -> tuple[Any, Any, str]:
    """``(api module, bindings module, error)``; modules are ``None`` when NIXL cannot load."""
    errors = []
    for name in MODULES:
        try:
            api = importlib.import_module(name)
            bindings = importlib.import_module(f"{name}._bindings")
        except Exception as exc:  # a missing wheel, or one whose libraries cannot load
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if hasattr(api, "nixl_agent"):
            return api, bindings, ""
    return None, None, "; ".join(errors)


def api() -> Any:
    """NIXL's Python API module (``nixl_agent``, ``nixl_agent_config``)."""
    module, _bindings, error = _load()
    if module is None:
        raise ImportError(f"NIXL cannot be imported ({error})")
    return module


def bindings() -> Any:
    """NIXL's compiled bindings (descriptor lists, memory types, status codes)."""
    _api, module, error = _load()
    if module is None:
        raise ImportError(f"NIXL cannot be imported ({error})")
    return module


#: Microseconds the service thread sleeps between rounds of progress while a peer is
#: connected: how soon a target that is not itself waiting takes in a transfer over TCP.
#: Idle with a peer connected, about 3.5% of a core here; 0 polls without pause (a core).
PROGRESS_US = 500
#: Overrides ``PROGRESS_US`` (read when the process's agent starts).
PROGRESS_VARIABLE = "TORCHCOMM_NIXL_PROGRESS_US"


def progress_us() -> int:
    """``TORCHCOMM_NIXL_PROGRESS_US``, or ``PROGRESS_US`` when unset."""
    raw = os.environ.get(PROGRESS_VARIABLE, "").strip()
    if not raw:
        return PROGRESS_US
    if not raw.isdigit():
        raise ValueError(
            f"{PROGRESS_VARIABLE}={raw!r} is not a whole number of microseconds; unset it or "
            f"give e.g. 500 (0 polls without pause)"
        )
    return int(raw)


#: UCX settings the agent starts with unless the environment sets them. Over TCP a READ
#: comes back in segments of ``UCX_TCP_TX_SEG_SIZE`` bytes, each a message the target's
#: progress sends: at UCX's default (8 KiB) reads reached 46% of a 10 Gbit/s link between
#: namespaces, at 64 KiB the link's rate (writes are unaffected).
UCX_DEFAULTS = {"UCX_TCP_TX_SEG_SIZE": "64k"}


def start_agent(name: str) -> tuple[Any, Any]:
    """A NIXL agent named ``name`` with a UCX backend: ``(agent, UCX backend handle)``."""
    for key, value in UCX_DEFAULTS.items():
        os.environ.setdefault(key, value)  # UCX reads its settings when the backend starts
    b = bindings()
    config = b.nixlAgentConfig()
    # Progress is made by the calls that wait (see the module docstring): NIXL's own thread
    # would take UCX's events only once per millisecond, and a waiter calling in would not
    # progress UCX while it runs.
    config.useProgThread = False
    config.useListenThread = False
    config.syncMode = b.NIXL_THREAD_SYNC_NONE  # every call is made under one lock
    config.captureTelemetry = False
    agent = b.nixlAgent(name, config)
    plugins = list(agent.getAvailPlugins())
    if "UCX" not in plugins:
        raise RuntimeError(
            f"NIXL has no UCX plugin (it found {', '.join(plugins) or 'none'}); reinstall the "
            f"nixl-cu12 wheel"
        )
    return agent, agent.createBackend("UCX", {})


def unavailable_reason() -> str | None:
    """Why NIXL cannot run here, or ``None`` when it can."""
    module, _bindings, error = _load()
    if module is None:
        return f"the NIXL wheel cannot be imported; `pip install nixl-cu12` ({error})"
    return None

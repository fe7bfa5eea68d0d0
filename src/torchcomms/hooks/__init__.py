"""Hooks shipped with torchcomms: ``FlightRecorderHook``, ``NanCheckHook`` and ``clog``.

Re-exports only; the code lives in ``torchcomms_core.hooks.flight_recorder`` and
``torchcomms_core.hooks``. The submodules ``fr``, ``nan_check`` and ``clog`` hold one
name each (``from torchcomms.hooks.clog import clog``); ``torchcomms.hooks.clog`` itself
is the logger class. Importing this module registers the handlers PyTorch's debug server
calls (``torchcomms_fr_trace_json``, ``torchcomms_fr_dump_file``,
``torchcomms_health_check``).
"""

from torchcomms_core.hooks.debug_handlers import register_debug_handlers as _register

from . import clog as _clog_submodule  # noqa: F401 - imported first: the class rebinds the name
from . import fr, nan_check  # noqa: F401
from .clog import clog
from .fr import FlightRecorderHook
from .nan_check import NanCheckHook

__all__ = ["clog", "FlightRecorderHook", "NanCheckHook"]

for _name in __all__:
    globals()[_name].__module__ = "torchcomms.hooks"
del _name

_register()

"""``FlightRecorderHook``: a ring buffer of a communicator's last operations, dumped as c10d does.

Dumps use the fields of c10d's own flight recorder, so PyTorch's analyzer
(``torch.distributed.flight_recorder``) can match operations across ranks. Hooks share
one process-wide recorder unless made ``isolated``, as in Meta's torchcomms.

Recording runs on every operation, so it keeps raw values only (shapes, dtypes, a stack
captured in C++, counters); dumps turn them into c10d's dicts. The package's modules,
lowest first:

- :mod:`.entry`: what is kept of one operation (the entry layout, tensor descriptions,
  the caller's stack);
- :mod:`.dump`: the dump format (c10d's fields, group names, the files written);
- :mod:`.ring`: the bounded store of entries and the communicators feeding it;
- :mod:`.hook`: ``FlightRecorderHook``, the process-wide recorder and the health flag.

The c10d bridge, above this package, installs what only it knows: the names of the
groups (``set_group_describer``) and the reader of its engine lane's calls
(``set_lane_reader``, see ``torchcomms_core.c10d.recorder_lane``). This package imports
nothing of the bridge.
"""

from torchcomms_core.hooks.flight_recorder.dump import (
    VERSION,
    dump_path,
    global_rank,
    ranks_str,
    set_group_describer,
)
from torchcomms_core.hooks.flight_recorder.hook import (
    FlightRecorderHook,
    global_recorder,
    global_recorder_in_use,
    is_healthy,
)
from torchcomms_core.hooks.flight_recorder.hook import (
    _set_healthy as _set_healthy,
)
from torchcomms_core.hooks.flight_recorder.ring import EngineLane, lane_track, set_lane_reader

__all__ = [
    "VERSION",
    "EngineLane",
    "FlightRecorderHook",
    "dump_path",
    "global_rank",
    "global_recorder",
    "global_recorder_in_use",
    "is_healthy",
    "lane_track",
    "ranks_str",
    "set_group_describer",
    "set_lane_reader",
]

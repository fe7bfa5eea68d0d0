"""The backend spec: ``TorchCommBackend``, the contract every backend plugin implements.

A backend writes the required primitives (lifecycle, ``send``, ``recv``); every other
operation has a portable default, written against those primitives. Overriding a
default makes it *native*; :func:`method_support` tells which is which.

The package owns the contract and what it is built from, one module each (a module
imports only those below it):

- ``backend``: :class:`TorchCommBackend` (class attributes, required and optional
  methods, the calling contract stated once) and the method lists: what a vendor reads.
- ``checks``: :func:`method_support`, :func:`backend_class_problems`,
  :func:`check_spec_version`, :func:`method_signature`.
- ``defaults``: :class:`PortableDefaults`, the derivable operations' portable
  implementations that ``TorchCommBackend`` inherits.
- ``work``: the work combinators (:class:`MultiWork`, :func:`then`, :func:`settle`) and
  tensor helpers the defaults, the core and backends share.
- ``window``: the one-sided window contract (:class:`WindowEngine`).
- ``tuning``: algorithms a backend declares, the tuner contract (:class:`Tuner`) and each
  communicator's chooser (:class:`Tuning`).
- ``transport``: the RDMA transport contract (imported as ``torchcomms_core.spec.transport``).

It may import ``torchcomms_core.operations`` and ``torchcomms_core.foundation`` only.
Every public name is re-exported here: ``from torchcomms_core.spec import X``.
"""

from __future__ import annotations

# The reduce-op types stay importable from here, as before (their home is operations).
from torchcomms_core.operations.reduce_op import RedOpType as RedOpType
from torchcomms_core.operations.reduce_op import ReduceOp as ReduceOp
from torchcomms_core.spec.backend import (
    BASIC_REDUCE_OPS,
    DEFAULT_DTYPES,
    DERIVABLE_METHODS,
    OPTIONAL_METHODS,
    REQUIRED_METHODS,
    SPEC_VERSION,
    TorchCommBackend,
)
from torchcomms_core.spec.checks import (
    backend_class_problems,
    check_spec_version,
    method_signature,
    method_support,
    set_collective_source,
)
from torchcomms_core.spec.defaults import BatchOp, PortableDefaults
from torchcomms_core.spec.tuning import (
    TUNER_SPEC_VERSION,
    Algorithm,
    Choice,
    OpAlgorithms,
    Query,
    Tuner,
    TunerContext,
    Tuning,
    TuningWarning,
    size_bucket,
)
from torchcomms_core.spec.window import TorchCommWinAccessType, WindowEngine
from torchcomms_core.spec.work import (
    MultiWork,
    ThenWork,
    flat_chunks,
    overlaps,
    reduce_rows,
    settle,
    split_dim0,
    then,
    unflatten_into,
)

__all__ = [
    # the contract (spec.backend)
    "SPEC_VERSION",
    "REQUIRED_METHODS",
    "DERIVABLE_METHODS",
    "OPTIONAL_METHODS",
    "DEFAULT_DTYPES",
    "BASIC_REDUCE_OPS",
    "BatchOp",
    "TorchCommBackend",
    # checks against it (spec.checks)
    "method_support",
    "backend_class_problems",
    "check_spec_version",
    "method_signature",
    "set_collective_source",
    # the portable defaults (spec.defaults)
    "PortableDefaults",
    # works and tensor helpers (spec.work)
    "MultiWork",
    "ThenWork",
    "then",
    "settle",
    "flat_chunks",
    "unflatten_into",
    "split_dim0",
    "reduce_rows",
    "overlaps",
    # algorithms and tuners (spec.tuning)
    "TUNER_SPEC_VERSION",
    "Algorithm",
    "Choice",
    "OpAlgorithms",
    "Query",
    "Tuner",
    "TunerContext",
    "Tuning",
    "TuningWarning",
    "size_bucket",
    # windows (spec.window)
    "TorchCommWinAccessType",
    "WindowEngine",
]

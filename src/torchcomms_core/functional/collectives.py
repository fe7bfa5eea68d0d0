"""Register the ``torchcomms`` custom ops and route ``TorchComm`` through them.

``import torchcomms`` imports this module when
:func:`~torchcomms_core.functional.is_torch_compile_supported_and_enabled` is true
(``TORCHCOMMS_PATCH_FOR_COMPILE=1``); importing it directly does the same.
"""

from __future__ import annotations

from torchcomms_core.functional import pending
from torchcomms_core.functional.async_results import FakeWork, TorchCommsAsyncTensor
from torchcomms_core.functional.autograd import DIFFERENTIABLE, register_formulas
from torchcomms_core.functional.ops import CommRef, define_ops
from torchcomms_core.functional.patch import mark_plugin_collectives, patch_torchcomm, ref_of
from torchcomms_core.functional.table import NAMESPACE, OPS, OpSpec

__all__ = [
    "DIFFERENTIABLE",
    "NAMESPACE",
    "OPS",
    "CommRef",
    "FakeWork",
    "OpSpec",
    "TorchCommsAsyncTensor",
    "mark_plugin_collectives",
    "op_names",
    "pending",
    "ref_of",
]


def op_names() -> list[str]:
    """Every op this module registers, as ``torchcomms::<name>``."""
    names = []
    for spec in OPS:
        if spec.written is not None:
            names.append(f"{NAMESPACE}::{spec.inplace_name}")
        names.append(f"{NAMESPACE}::{spec.functional_name}")
    names += [f"{NAMESPACE}::torchcomm_wait_tensors_", f"{NAMESPACE}::torchcomm_wait_tensors"]
    return names


define_ops()
register_formulas()
patch_torchcomm()

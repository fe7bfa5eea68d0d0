"""The ``ProcessGroup`` wrapper ``torch.distributed`` uses under TORCH_DISTRIBUTED_USE_TORCHCOMMS=1.

Re-exports only; the code lives in ``torchcomms_core.c10d.backend_wrapper``.
"""

from torchcomms_core.c10d.backend_wrapper import BackendWrapper as _BackendWrapper

__all__ = ["_BackendWrapper"]

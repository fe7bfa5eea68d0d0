"""Engine adapters backends build on: any c10d process group, and the CUDA engines.

``C10dBackend`` turns a c10d ``ProcessGroup``/``Backend`` into a ``TorchCommBackend``
(the gloo plugin is one); ``cuda_support`` holds what the NCCL and RCCL plugins share.
"""

from __future__ import annotations

from torchcomms_core.engines.c10d_engine import C10dBackend

__all__ = ["C10dBackend"]

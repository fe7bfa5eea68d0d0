"""Engine adapters backends build on: any c10d process group, and the CUDA engines.

- ``c10d_engine``: ``C10dBackend`` turns a c10d ``ProcessGroup``/``Backend`` into a
  ``TorchCommBackend`` (the gloo plugin is one).
- ``c10d_registered``: the same adapter over a backend registered with c10d only.
- ``nccl_engine``: ``NcclEngineBackend``, the adapter of torch's ``ProcessGroupNCCL``
  (the ncclx and rccl plugins); ``cuda_support`` holds what that family shares besides it.
- ``fake``: ``FakeBackend``, which completes every operation without communicating.

Engines may import ``spec``, ``creation``, ``operations`` and ``foundation``.
"""

from __future__ import annotations

from torchcomms_core.engines.c10d_engine import C10dBackend

__all__ = ["C10dBackend"]

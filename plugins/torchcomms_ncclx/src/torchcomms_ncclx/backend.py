"""``NCCLXBackend``: torch's ``ProcessGroupNCCL`` with eager init, native split and abort.

The engine logic lives in the core's ``cuda_support``; this module adds what is NVIDIA's.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from torchcomms_core.plugin import (
    NcclEngineBackend,
    cuda_unavailable_reason,
    nccl_available,
    rocm_version,
)


class NCCLXBackend(NcclEngineBackend):
    """GPU communicator on NCCL; one communicator per CUDA device and process.

    Hints (``new_comm(..., hints={...})``, values ``"true"``/``"false"``):

    - ``ncclx.high_priority_stream``: queue NCCL kernels on a high-priority stream.
    - ``ncclx.register_memory``: create ``mem_pool``, a ``torch.cuda.MemPool`` on NCCL's
      allocator registered with the communicator; tensors allocated inside
      ``torch.cuda.use_mem_pool(backend.mem_pool)`` are registered with NCCL.
    """

    hint_prefix: ClassVar[str] = "ncclx"

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        hip = rocm_version()
        if hip is not None:
            return False, (
                f"this is a ROCm build of PyTorch (torch.version.hip={hip!r}); "
                f"use the rccl backend: pip install torchcomms-rccl"
            )
        reason = cuda_unavailable_reason()
        if reason is not None:
            return False, reason
        if not nccl_available():
            return False, "this PyTorch build has no NCCL"
        return True, "ok"

    def get_backend_name(self) -> str:
        return "ncclx"

    @staticmethod
    def nccl_version() -> tuple[int, ...] | None:
        """The NCCL version torch was built with, ``None`` on a build without NCCL."""
        try:
            # torch.cuda.nccl.version carries no annotations in torch.
            version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
        except (AttributeError, RuntimeError):
            return None
        return tuple(int(v) for v in version[:3])

"""``RCCLBackend``: torch's NCCL engine on a ROCm build, where it is RCCL underneath.

The engine logic lives in the core's ``cuda_support``; ROCm GPUs present as ``cuda``.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from torchcomms_core.plugin import NcclEngineBackend, nccl_available, rocm_version

NOT_ROCM_REASON = (
    "needs a ROCm build of PyTorch (torch.version.hip is None); install torch "
    "for ROCm or use torchcomms-ncclx on NVIDIA GPUs"
)


class RCCLBackend(NcclEngineBackend):
    """AMD GPU communicator on RCCL; devices are ``torch.device("cuda", i)`` as in torch.

    Hints: ``rccl.high_priority_stream`` and ``rccl.register_memory`` (see the ncclx
    backend; RCCL honours them where its version supports the feature).
    """

    hint_prefix: ClassVar[str] = "rccl"

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        if rocm_version() is None:
            return False, NOT_ROCM_REASON
        if not torch.cuda.is_available():
            return False, (
                "no ROCm GPU: torch.cuda.is_available() is False; check "
                "HIP_VISIBLE_DEVICES and the driver (rocm-smi)"
            )
        if not nccl_available():
            return False, (
                "this PyTorch ROCm build has no RCCL "
                "(torch.distributed.is_nccl_available() is False)"
            )
        return True, "ok"

    def get_backend_name(self) -> str:
        return "rccl"

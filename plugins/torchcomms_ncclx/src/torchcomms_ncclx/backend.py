"""``NCCLXBackend``: torch's ``ProcessGroupNCCL`` with eager init, native split and abort.

The engine logic lives in the core's ``cuda_support``; this module adds what is NVIDIA's.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from torchcomms_core.plugin import (
    NcclEngineBackend,
    cuda_unavailable_reason,
    nccl_available,
    rocm_version,
)

from . import hints as ncclx_hints
from . import ncclx_only


class NCCLXBackend(NcclEngineBackend):
    """GPU communicator on NCCL; one communicator per CUDA device and process.

    Hints (``new_comm(..., hints={...})``): NCCL's config fields by their own names
    (``cgaClusterSize``, ...), NCCLX's ``ncclx::*`` hints and the reference's NCCLX keys
    (see ``torchcomms_ncclx.hints``), and, values ``"true"``/``"false"``:

    - ``ncclx.high_priority_stream``: queue NCCL kernels on a high-priority stream.
    - ``ncclx.register_memory``: create ``mem_pool``, a ``torch.cuda.MemPool`` on NCCL's
      allocator registered with the communicator; tensors allocated inside
      ``torch.cuda.use_mem_pool(backend.mem_pool)`` are registered with NCCL.
    """

    hint_prefix: ClassVar[str] = "ncclx"
    hint_keys: ClassVar[tuple[str, ...] | None] = (
        *ncclx_hints.LAYER_KEYS,
        *ncclx_hints.NCCL_CONFIG_FIELDS,
        f"{ncclx_hints.NCCLX_PREFIX}*",
        "ncclx.high_priority_stream",
        "ncclx.register_memory",
    )
    #: What the last ``init``'s hints said beside NCCL's config (see ``hints.NcclxHints``).
    settings: ncclx_hints.NcclxHints | None = None

    def config_hints(self, hints: dict[str, str]) -> list[tuple[str, str, Any]]:
        """NCCL's config fields by their own names (the reference's scheme); the NCCLX
        keys are checked and kept in ``settings``, ``ncclx::*`` in ``ncclx_hints``."""
        self.settings = ncclx_hints.parse(hints)
        ncclx_hints.warn_unapplied(self.settings.ncclx, getattr(self, "comm_name", ""))
        return self.settings.config

    @property
    def ncclx_hints(self) -> dict[str, str]:
        """The ``ncclx::*`` hints given (torch's NCCL engine has no NCCLX hints to set)."""
        return dict(self.settings.ncclx) if self.settings is not None else {}

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
        return ncclx_only.nccl_version()

    # -- the reference's NCCLX-only methods (see ncclx_only for what this engine allows) --

    def comm_dump(self) -> dict[str, str]:
        """What torchcomms knows of this communicator (``commHash``, ``rank``, ``nRanks``,
        ...), each value JSON text; NCCLX's internal state needs NCCLX itself."""
        return ncclx_only.comm_dump(self)

    def get_nccl_comm_ptr(self) -> int:
        """The engine's ``ncclComm_t`` as an int (torch's ``ProcessGroupNCCL._comm_ptr``)."""
        return ncclx_only.get_nccl_comm_ptr(self)

    def set_config(self, hints: dict[str, str]) -> None:
        """NCCLX's ``ncclx::commSetConfig``: stock NCCL cannot change a live communicator,
        so any setting raises ``CommStateError`` saying to pass it at creation."""
        ncclx_only.set_config(self, hints)

    def device_alltoallv_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: torch.Tensor,
        input_split_sizes: torch.Tensor,
        async_op: bool,
    ) -> Any:
        """``all_to_all_v_single`` with the split sizes (rows of dim 0) in int64 tensors on
        the device; they are copied to the host first (NCCLX reads them on the GPU)."""
        return ncclx_only.device_alltoallv_single(
            self, output, input, output_split_sizes, input_split_sizes, async_op
        )


def comm_dump_all(hints: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Every live ncclx communicator of this process, keyed by its ``commHash``;
    ``hints={"comm_dump::requestFields": "rank;nRanks"}`` keeps only those fields."""
    return ncclx_only.comm_dump_all(NCCLXBackend._live, hints)

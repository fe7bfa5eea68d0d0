"""What the backends on torch's ``ProcessGroupNCCL`` engine share besides the adapter.

Availability checks, device resolution, the NCCL-family hints (and the ``ncclConfig_t``
fields they set) and :class:`CudaWork`, the completion handle with CUDA stream semantics.
The adapter itself, :class:`~torchcomms_core.engines.nccl_engine.NcclEngineBackend`, is
in ``nccl_engine``, which re-exports every name here.

Imports: ``torch`` and ``torchcomms_core.foundation``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import BootstrapError, CommInputError

#: What ``is_available`` reports when torch sees no GPU.
NO_CUDA_REASON = "no CUDA device: torch.cuda.is_available() is False"


# -- availability ------------------------------------------------------------------------


def rocm_version() -> str | None:
    """The HIP version of a ROCm build of torch, ``None`` on CUDA and CPU builds."""
    return getattr(torch.version, "hip", None)


def cuda_unavailable_reason() -> str | None:
    """Why torch cannot use a GPU here, or ``None`` when it can."""
    if not torch.cuda.is_available():
        return NO_CUDA_REASON
    return None


def nccl_available() -> bool:
    """Whether this torch build ships the NCCL (on ROCm: RCCL) engine."""
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_nccl_available())


# -- devices -----------------------------------------------------------------------------


def _local_rank_source() -> str | None:
    for var in _env.LOCAL_RANK_VARS:
        if os.environ.get(var) not in (None, ""):
            return var
    return None


def resolve_device(
    device: torch.device, rank: int, *, device_count: int | None = None
) -> torch.device:
    """Return the indexed CUDA device a rank uses: ``cuda`` alone means ``cuda:<local rank>``.

    The local rank comes from the launcher (``LOCAL_RANK`` and friends); without one,
    ``rank % device_count``, which is what torch's own NCCL engine guesses.
    """
    if device.type != "cuda":
        raise CommInputError(f"expected a CUDA device, got {device}; pass torch.device('cuda')")
    count = torch.cuda.device_count() if device_count is None else device_count
    if count < 1:
        raise CommInputError(
            f"{device} requested, but this process sees no CUDA device; "
            f"check CUDA_VISIBLE_DEVICES and the driver (nvidia-smi)"
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    sees = f"this process sees {count} CUDA device(s)" + (
        f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    )
    if device.index is not None:
        if not 0 <= device.index < count:
            raise CommInputError(
                f"{device} does not exist: {sees}; pass an index in 0..{count - 1}"
            )
        return device
    try:
        local = _env.local_rank()
    except ValueError:
        var = _local_rank_source()
        raise BootstrapError(
            f"{var}={os.environ.get(var)!r} is not an integer local rank; "
            f"fix the launcher's environment or pass torch.device('cuda', i)"
        ) from None
    if local is None:
        return torch.device("cuda", rank % count)
    if not 0 <= local < count:
        raise CommInputError(
            f"local rank {local} (from {_local_rank_source()}) has no GPU: {sees}; start at "
            f"most {count} processes per node or pass torch.device('cuda', i) to new_comm"
        )
    return torch.device("cuda", local)


def bind_device(device: torch.device) -> None:
    """Make ``device`` the process's current CUDA device (NCCL binds a communicator to it)."""
    torch.cuda.set_device(device)


# -- hints -------------------------------------------------------------------------------


#: The reference's hints of the NCCL family, read by every backend on this engine.
HIGH_PRIORITY_STREAM = "is_high_priority_stream"
MAX_EVENT_POOL_SIZE = "max_event_pool_size"
PERSISTENT_STORE = "persistent_store"
#: The reference's default ``max_event_pool_size``.
DEFAULT_EVENT_POOL_SIZE = 1000

# ``<prefix>::<key>`` hints set a field of NCCL's ``ncclConfig_t``: NCCL's own field name
# (or torch's snake_case spelling) -> (torch's NCCLConfig attribute, value type).
NCCL_CONFIG_FIELDS: dict[str, tuple[str, type]] = {
    "blocking": ("blocking", int),
    "cgaClusterSize": ("cga_cluster_size", int),
    "minCTAs": ("min_ctas", int),
    "maxCTAs": ("max_ctas", int),
    "netName": ("net_name", str),
    "splitShare": ("split_share", int),
    "trafficClass": ("traffic_class", int),
    "collnetEnable": ("collnet_enable", int),
    "CTAPolicy": ("cta_policy", int),
    "nvlsCTAs": ("nvls_ctas", int),
}
_CONFIG_BY_NAME = {
    **NCCL_CONFIG_FIELDS,
    **{attr: (attr, kind) for attr, kind in NCCL_CONFIG_FIELDS.values()},
}


def nccl_config_hints(hints: dict[str, str], prefix: str) -> list[tuple[str, str, Any]]:
    """The ``<prefix>::<field>`` hints as ``(hint key, NCCLConfig attribute, value)``.

    Raises :class:`CommInputError` for a field NCCL's config does not have or a value
    of the wrong type.
    """
    marker = f"{prefix}::"
    out: list[tuple[str, str, Any]] = []
    for key, raw in hints.items():
        if not key.startswith(marker):
            continue
        field = key[len(marker) :]
        found = _CONFIG_BY_NAME.get(field)
        if found is None:
            listing = ", ".join(f"{marker}{k}" for k in NCCL_CONFIG_FIELDS)
            raise CommInputError(
                f"hint {key!r}: NCCL's config has no field {field!r}; the fields are {listing}"
            )
        attr, kind = found
        if kind is int:
            try:
                value: Any = int(raw.strip())
            except ValueError:
                raise CommInputError(
                    f"hint {key}={raw!r}: ncclConfig_t.{field} is an integer; pass e.g. '4'"
                ) from None
        else:
            value = raw
        out.append((key, attr, value))
    return out


def apply_nccl_config(config: Any, settings: list[tuple[str, str, Any]]) -> None:
    """Set the fields of torch's ``ProcessGroupNCCL.NCCLConfig`` that the hints name."""
    for key, attr, value in settings:
        if not hasattr(config, attr):
            raise CommInputError(
                f"hint {key!r}: this PyTorch build's NCCL config has no {attr!r} (its NCCL "
                f"version predates the field); drop the hint or use a newer PyTorch"
            )
        setattr(config, attr, value)


def check_hint_keys(hints: dict[str, str], prefix: str, known: Sequence[str]) -> None:
    """Refuse hints in this backend's namespace that it does not know (typos)."""
    for key in hints:
        if key.startswith(prefix + ".") and key[len(prefix) + 1 :] not in known:
            listing = ", ".join(f"{prefix}.{k}" for k in known)
            raise CommInputError(f"unknown hint {key!r}; this backend knows {listing}")


# -- completion --------------------------------------------------------------------------


class CudaWork:
    """Handle of c10d GPU works with torchcomms' stream semantics.

    ``wait()`` makes the caller's current CUDA stream wait for the operation and returns
    at once; ``wait_blocking()`` blocks the host until the operation has completed.
    Objects in ``keep`` (e.g. a device-side PREMUL_SUM factor) live until then.
    """

    __slots__ = ("_works", "_timeout", "_keep")

    def __init__(self, works: Sequence[Any], timeout: timedelta | None, keep: Any = None) -> None:
        self._works = tuple(works)
        self._timeout = timeout
        self._keep = keep

    def wait(self) -> bool:
        # Without a timeout, c10d's NCCL work only orders the current stream after the
        # engine's stream; with one it would spin the host until the GPU finishes.
        for work in self._works:
            work.wait()
        self._keep = None
        return True

    def wait_blocking(self) -> bool:
        for work in self._works:
            if self._timeout is not None and self._timeout > timedelta(0):
                work.wait(self._timeout)
            else:
                while not work.is_completed():
                    time.sleep(0.0002)
                work.wait()
        self._keep = None
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)


def cuda_allocator(backend: str) -> Any:
    """torch.cuda's current allocator, or a clear error where there is no CUDA."""
    reason = cuda_unavailable_reason()
    if reason is not None:
        raise CommInputError(
            f"get_mem_allocator: backend {backend!r} allocates CUDA memory, but {reason}; "
            f"call it on a machine with a GPU (CPU tensors need no allocator)"
        )
    return torch.cuda.memory._get_current_allocator()

"""The reference's NCCLX-only methods, on torch's ``ProcessGroupNCCL`` as far as it allows.

Each takes the backend (any ``NcclEngineBackend``); ``backend`` binds them as methods of
``NCCLXBackend``. Imports only the core's plugin namespace, never ``backend``.

The reference's ``TorchCommNCCLX`` calls NCCLX, Meta's NCCL fork, for these. Our engine is
torch's ``ProcessGroupNCCL`` over the NCCL torch ships, so each method does what that
engine can, and says clearly what it cannot:

- ``comm_dump()`` / ``comm_dump_all(hints)``: what torchcomms knows of each communicator
  (``commHash``, ``rank``, ``nRanks``, ...), JSON-encoded as NCCLX encodes its values.
  NCCLX's internal state (collective traces, proxy and network state) needs NCCLX's
  ``ncclCommDump``, which stock NCCL does not have; those keys are absent.
- ``get_nccl_comm_ptr()``: the ``ncclComm_t`` of the engine (torch's ``_comm_ptr``).
- ``set_config(hints)``: NCCLX's ``ncclx::commSetConfig`` changes a live communicator's
  algorithm choices; stock NCCL has no such call, so any setting raises an error saying
  to pass it as a creation hint instead (an empty dict changes nothing and is accepted).
- ``device_alltoallv_single(...)``: split sizes given as device tensors. NCCLX reads them
  on the GPU; here they are copied to the host (one device synchronisation) and the
  engine's ``alltoall_base`` runs with them.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import torch

from torchcomms_core.plugin import (
    CommInputError,
    CommStateError,
    CommTypeError,
    NcclEngineBackend,
)

#: The hint of ``comm_dump_all`` that keeps only some fields: ``"rank;nRanks"``.
REQUEST_FIELDS = "comm_dump::requestFields"
_DUMP_HINTS = (REQUEST_FIELDS,)


def _string_dict(value: Any, where: str, what: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise CommTypeError(f"{where}: {what} must be a dict[str, str], got {type(value).__name__}")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise CommTypeError(
                f"{where}: {what} must map str to str, got {k!r}: {v!r} "
                f"({type(k).__name__}: {type(v).__name__})"
            )
    return dict(value)


def _engine(backend: NcclEngineBackend, where: str) -> Any:
    engine = getattr(backend, "_engine", None)
    if engine is None:
        raise CommStateError(
            f"{where}: this ncclx communicator has no engine (not initialized, finalized or "
            f"aborted); create one with torchcomms.new_comm('ncclx', ...)"
        )
    return engine


def nccl_version() -> tuple[int, ...] | None:
    """The NCCL version torch was built with, ``None`` on a build without NCCL."""
    try:
        # torch.cuda.nccl.version carries no annotations in torch.
        version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    except (AttributeError, RuntimeError):
        return None
    return tuple(int(v) for v in version[:3])


def comm_hash(name: str, global_ranks: list[int]) -> str:
    """The communicator's ``commHash`` in dumps: 16 hex digits of its name and members, the
    same on every member and different for a split (NCCL's own hash needs NCCLX to read)."""
    text = f"{name}|{','.join(map(str, global_ranks))}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def dump_fields(
    *,
    name: str,
    rank: int,
    size: int,
    global_ranks: list[int],
    device: torch.device,
    nccl_version: tuple[int, ...] | None,
    comm_ptr: int | None,
) -> dict[str, str]:
    """A ``comm_dump`` dict: every value is JSON text, as NCCLX writes it."""
    local = os.environ.get("LOCAL_RANK", os.environ.get("TORCHCOMM_LOCAL_RANK"))
    fields: dict[str, Any] = {
        "commHash": comm_hash(name, global_ranks),
        "commDesc": name,
        "rank": rank,
        "nRanks": size,
        "localRank": int(local) if local is not None and local.isdigit() else None,
        "cudaDev": device.index,
        "globalRanks": global_ranks,
        "ncclVersion": ".".join(map(str, nccl_version)) if nccl_version else None,
        "commPtr": comm_ptr,
        "source": "torchcomms (torch ProcessGroupNCCL); NCCLX internal state unavailable",
    }
    return {k: json.dumps(v) for k, v in fields.items()}


def comm_dump(backend: NcclEngineBackend) -> dict[str, str]:
    """``TorchCommNCCLX.comm_dump()``: see the module docstring."""
    engine = _engine(backend, "comm_dump")
    rank, size = backend.get_rank(), backend.get_size()
    ranks = list(backend._global_ranks or range(size))
    return dump_fields(
        name=backend._group_name or getattr(backend, "comm_name", ""),
        rank=rank,
        size=size,
        global_ranks=ranks,
        device=backend.device,
        nccl_version=nccl_version(),
        comm_ptr=_comm_ptr_or_none(engine),
    )


def comm_dump_all(live: Any, hints: Any = None) -> dict[str, dict[str, str]]:
    """``comm_dump_all(hints={})``: every live ncclx communicator of this process, by its
    ``commHash``. ``hints={"comm_dump::requestFields": "rank;nRanks"}`` keeps those fields."""
    where = "comm_dump_all"
    hints = _string_dict({} if hints is None else hints, where, "hints")
    unknown = sorted(set(hints) - set(_DUMP_HINTS))
    if unknown:
        raise CommInputError(
            f"{where}: unknown hint(s) {unknown}; the one hint read is {REQUEST_FIELDS!r} "
            f"(fields separated by ';', e.g. 'rank;nRanks')"
        )
    wanted = [f for f in hints.get(REQUEST_FIELDS, "").split(";") if f]
    out: dict[str, dict[str, str]] = {}
    for backend in list(live):
        if getattr(backend, "_engine", None) is None:
            continue  # finalized or aborted: NCCL no longer lists it either
        dump = comm_dump(backend)
        key = json.loads(dump["commHash"])
        out[key] = {k: v for k, v in dump.items() if k in wanted} if wanted else dump
    return out


def _comm_ptr_or_none(engine: Any) -> int | None:
    probe = getattr(engine, "_comm_ptr", None)
    if probe is None:
        return None
    try:
        return int(probe())
    except Exception:
        return None


def get_nccl_comm_ptr(backend: NcclEngineBackend) -> int:
    """``get_nccl_comm_ptr()``: the engine's ``ncclComm_t`` as an int."""
    engine = _engine(backend, "get_nccl_comm_ptr")
    probe = getattr(engine, "_comm_ptr", None)
    if probe is None:
        raise CommStateError(
            f"get_nccl_comm_ptr: this torch's ProcessGroupNCCL ({torch.__version__}) does not "
            f"expose its ncclComm_t (no _comm_ptr()); it is not available on this engine"
        )
    ptr = int(probe())
    if ptr == 0:
        raise CommStateError(
            "get_nccl_comm_ptr: the engine has no NCCL communicator yet (torch creates it "
            "on first use unless eager init ran); run a collective first"
        )
    return ptr


def set_config(backend: NcclEngineBackend, hints: Any) -> None:
    """``set_config(hints)``: refused for any setting (see the module docstring)."""
    where = "set_config"
    hints = _string_dict(hints, where, "hints")
    _engine(backend, where)
    if not hints:
        return
    version = nccl_version()
    shown = ".".join(map(str, version)) if version else "unknown"
    raise CommStateError(
        f"set_config: changing a live communicator's configuration ({sorted(hints)}) needs "
        f"NCCLX's ncclx::commSetConfig; this ncclx backend runs on torch's ProcessGroupNCCL "
        f"with NCCL {shown}, which has no such call. Pass the settings when creating the "
        f"communicator instead: new_comm('ncclx', ..., hints={{'ncclx::<field>': value}})"
    )


def check_device_alltoallv(
    output: Any,
    input: Any,
    output_split_sizes: Any,
    input_split_sizes: Any,
    size: int,
    device: torch.device,
) -> None:
    """The reference's checks of ``device_alltoallv_single``, before anything runs."""
    where = "device_alltoallv_single"
    for arg, t in (
        ("output", output),
        ("input", input),
        ("output_split_sizes", output_split_sizes),
        ("input_split_sizes", input_split_sizes),
    ):
        if not isinstance(t, torch.Tensor):
            raise CommTypeError(f"{where}: {arg} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != device.type or (
            device.index is not None and t.device.index not in (None, device.index)
        ):
            raise CommInputError(
                f"{where}: {arg} is on {t.device}, but the communicator owns {device}; "
                f"move it with .to({str(device)!r}) (split sizes too: NCCLX reads them on "
                f"the device)"
            )
        if not t.is_contiguous():
            raise CommInputError(f"{where}: {arg} must be contiguous; pass {arg}.contiguous()")
    for arg, t in (
        ("output_split_sizes", output_split_sizes),
        ("input_split_sizes", input_split_sizes),
    ):
        if t.dtype != torch.int64:
            raise CommInputError(
                f"{where}: {arg} must be an int64 tensor, got {str(t.dtype).replace('torch.', '')}"
            )
        if t.dim() != 1 or t.numel() != size:
            raise CommInputError(
                f"{where}: {arg} must be a 1-D tensor with one entry per rank ({size}), got "
                f"shape {tuple(t.shape)}"
            )
    if input.dtype != output.dtype:
        raise CommInputError(
            f"{where}: input has dtype {input.dtype} but output has {output.dtype}; they must match"
        )
    for arg, t in (("output", output), ("input", input)):
        if t.dim() == 0:
            raise CommInputError(
                f"{where}: {arg} must have at least one dimension (split sizes count its rows)"
            )
    in_row = input.numel() // input.size(0) if input.size(0) else None
    out_row = output.numel() // output.size(0) if output.size(0) else None
    if in_row is not None and out_row is not None and in_row != out_row:
        raise CommInputError(
            f"{where}: a row of input has {in_row} elements but a row of output has "
            f"{out_row}; rows (dim 0) must be the same size"
        )


def check_split_sums(out_splits: list[int], in_splits: list[int], output: Any, input: Any) -> None:
    """The split sizes (on the host now) against the tensors' rows."""
    where = "device_alltoallv_single"
    for arg, splits, t in (("output", out_splits, output), ("input", in_splits, input)):
        if any(s < 0 for s in splits):
            raise CommInputError(f"{where}: {arg}_split_sizes has negative entries: {splits}")
        if sum(splits) != t.size(0):
            raise CommInputError(
                f"{where}: {arg}_split_sizes sums to {sum(splits)} rows but {arg} has "
                f"{t.size(0)} rows (split sizes count rows of dim 0)"
            )


def device_alltoallv_single(
    backend: NcclEngineBackend,
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: torch.Tensor,
    input_split_sizes: torch.Tensor,
    async_op: bool,
) -> Any:
    """``device_alltoallv_single``: see the module docstring."""
    _engine(backend, "device_alltoallv_single")
    check_device_alltoallv(
        output, input, output_split_sizes, input_split_sizes, backend.get_size(), backend.device
    )
    out_splits = [int(s) for s in output_split_sizes.tolist()]  # the host copy (a sync)
    in_splits = [int(s) for s in input_split_sizes.tolist()]
    check_split_sums(out_splits, in_splits, output, input)
    return backend.all_to_all_v_single(output, input, out_splits, in_splits, async_op)

"""All-reduce of sparse COO tensors over a communicator, the way gloo does it.

Each rank coalesces its input, the ranks exchange sizes, then indices and values, and
every rank adds the contributions in rank order and coalesces the sum. Only ``SUM`` is
defined for sparse tensors, as in gloo.
"""

from __future__ import annotations

from datetime import timedelta

import torch

from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.operations.reduce_op import RedOpType, ReduceOp


def sparse_all_reduce(
    comm: TorchComm,
    tensors: list[torch.Tensor],
    op: ReduceOp,
    timeout: timedelta | None,
    label: str = "ProcessGroupGloo",
) -> torch.Tensor:
    """Return the coalesced sum over all ranks of ``tensors`` (summed locally first).
    ``label``: who speaks in errors (the group's engine, or the torchcomms backend)."""
    if op.type is not RedOpType.SUM:
        raise RuntimeError(
            f"{label}::allreduce: unsupported reduction operation (allreduce of "
            f"sparse tensors only works with ReduceOp.SUM; got {op.type.name})"
        )
    if any(t.layout != torch.sparse_coo for t in tensors):
        raise RuntimeError(
            f"{label}::allreduce: input tensors must all be sparse "
            "COO tensors or all dense; convert them with .to_sparse() or "
            ".to_dense()"
        )
    local = tensors[0]
    for t in tensors[1:]:
        local = local + t
    local = local.coalesce()
    n, device = comm.get_size(), local.device
    indices, values = local.indices(), local.values()
    meta = torch.tensor(
        [local.sparse_dim(), local.dense_dim(), indices.shape[1], *local.shape],
        dtype=torch.int64,
        device=device,
    )
    metas = meta.new_empty(n * meta.numel())
    comm.all_gather_single(metas, meta, timeout=timeout)
    metas = metas.view(n, -1)
    shape_of = torch.cat([metas[:, :2], metas[:, 3:]], dim=1)
    if not bool((shape_of == torch.cat([meta[:2], meta[3:]])).all()):
        raise RuntimeError(
            f"{label}::allreduce: sparse tensors differ across ranks in sparse or "
            f"dense dimensions or in size (rank {comm.get_rank()} has sparse_dim "
            f"{local.sparse_dim()}, dense_dim {local.dense_dim()}, size {list(local.shape)});"
            f" every rank must pass a tensor of the same shape"
        )
    counts = [int(c) for c in metas[:, 2].tolist()]
    most = max(counts)
    padded_idx = indices.new_zeros((indices.shape[0], most))
    padded_idx[:, : counts[comm.get_rank()]] = indices
    padded_val = values.new_zeros((most, *values.shape[1:]))
    padded_val[: counts[comm.get_rank()]] = values
    all_idx = padded_idx.new_empty((n, *padded_idx.shape))
    all_val = padded_val.new_empty((n, *padded_val.shape))
    comm.all_gather_single(all_idx, padded_idx, timeout=timeout)
    comm.all_gather_single(all_val, padded_val, timeout=timeout)
    out = torch.sparse_coo_tensor(
        all_idx[0, :, : counts[0]],
        all_val[0, : counts[0]],
        local.shape,
        dtype=local.dtype,
        device=device,
    )
    for r in range(1, n):
        out = out + torch.sparse_coo_tensor(
            all_idx[r, :, : counts[r]],
            all_val[r, : counts[r]],
            local.shape,
            dtype=local.dtype,
            device=device,
        )
    return out.coalesce()

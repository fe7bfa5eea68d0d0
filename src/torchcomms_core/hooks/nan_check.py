"""``NanCheckHook``: refuse an operation whose floating-point tensors hold a NaN.

A pre-hook checks the tensors before the operation is issued, so nothing is sent and the
communicator stays usable: inputs with ``check_inputs`` (default), output buffers with
``check_outputs``. In-place operations (``all_reduce``, ``reduce``, ``broadcast`` on its
root) are checked if either flag is set; a send counts as input, a receive as output.
The check is ``torch.ops.c10d.check_for_nan`` where PyTorch has it.
"""

from __future__ import annotations

from typing import Any

import torch

from torchcomms_core.comm.handles import RemovableHandle
from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.foundation.errors import CommInputError, CommTypeError
from torchcomms_core.hooks import _args


def _has_nan(t: torch.Tensor) -> bool:
    op = getattr(getattr(torch.ops, "c10d", None), "check_for_nan", None)
    if op is not None:
        try:
            op(t)
        except RuntimeError:
            return True
        return False
    return bool(torch.isnan(t).any())


class NanCheckHook:
    """Raise before an operation runs if one of its floating-point tensors holds a NaN."""

    def __init__(self, check_inputs: bool = True, check_outputs: bool = False) -> None:
        for name, value in (("check_inputs", check_inputs), ("check_outputs", check_outputs)):
            if not isinstance(value, bool):
                raise CommTypeError(f"NanCheckHook: {name} must be True or False, got {value!r}")
        self.check_inputs = check_inputs
        self.check_outputs = check_outputs
        self._handles: list[RemovableHandle] = []
        self._registered = 0

    def is_enabled(self) -> bool:
        """Whether the hook was registered with a communicator (the reference's meaning):
        ``False`` until the first :meth:`register_with_comm`, then ``True``."""
        return self._registered > 0

    def register_with_comm(self, comm: TorchComm) -> NanCheckHook:
        """Check every operation of ``comm`` from now on; returns the hook itself."""
        if not isinstance(comm, TorchComm):
            raise CommTypeError(
                f"register_with_comm: expected a TorchComm, got {type(comm).__name__}"
            )
        self._registered += 1
        if self.check_inputs or self.check_outputs:  # else there is nothing to check
            self._handles.append(
                comm.register_pre_hook(lambda name, op_id, args: self._check(comm, name, args))
            )
        return self

    def unregister(self) -> None:
        """Stop checking every communicator this hook was registered with."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _check(self, comm: TorchComm, name: Any, args: Any) -> None:
        op = str(getattr(name, "name", name))
        fields = _args.fields(args)
        checks: list[tuple[str, Any]] = []
        batch = _args.batch_ops(args) if op == "batch_op_issue" else None
        if batch is not None:
            for i, (kind, tensor, _) in enumerate(batch):
                if (kind == "send" and self.check_inputs) or (
                    kind == "recv" and self.check_outputs
                ):
                    checks.append((f"{kind} ops[{i}]", tensor))
        elif op in _args.IN_PLACE and "tensor" in fields:
            root = fields.get("root")
            receiver = op == "broadcast" and root is not None and root != comm.get_rank()
            if not receiver or self.check_outputs:
                checks.append(("tensor", fields["tensor"]))
        else:
            inp, out = _args.raw_io(op, fields)
            if self.check_inputs:
                checks.append(("input", inp))
            if self.check_outputs:
                checks.append(("output", out))
        for role, value in checks:
            for i, t in enumerate(_args.tensors(value)):
                if t.is_floating_point() and t.numel() and _has_nan(t):
                    where = role if isinstance(value, torch.Tensor) else f"{role}[{i}]"
                    raise CommInputError(
                        f"NanCheckHook: NaN found in the {where} of {op} (shape "
                        f"{tuple(t.shape)}, {str(t.dtype).replace('torch.', '')}) on "
                        f"communicator {comm.get_name()!r}, rank {comm.get_rank()}; the "
                        f"operation was not run. Find where the NaN is produced (e.g. with "
                        f"torch.autograd.set_detect_anomaly(True)), or remove the hook"
                    )

    def __repr__(self) -> str:
        return f"<NanCheckHook check_inputs={self.check_inputs} check_outputs={self.check_outputs}>"

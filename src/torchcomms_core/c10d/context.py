"""Completing ``torch.distributed``'s view of torchcomms when we were imported first.

``torch.distributed`` looks torchcomms up while it is imported (under
``TORCH_DISTRIBUTED_USE_TORCHCOMMS``); see :func:`complete_torch_registration`. What c10d
passes when it creates a group on us is read by ``torchcomms_core.creation.group_record``.

A light entry point for the faces (``torchcomms``, ``torchcomms_core``): it loads the
bridge (``backend_wrapper``, which does the work) only when torch needs the names; the
bridge never imports it.
"""

from __future__ import annotations

import sys
from typing import Any

# Set when torch's autoload ran while our package was still being imported (torchcomms
# imported before torch): the face's completion registers the backends instead.
_pending = False


def _initializing(name: str) -> bool:
    module = sys.modules.get(name)
    return module is None or bool(
        getattr(getattr(module, "__spec__", None), "_initializing", False)
    )


def autoload() -> None:
    """torch's device-backend autoload entry point (group ``torch.backends``): make every
    installed torchcomms backend a ``torch.distributed`` backend name at ``import torch``.

    torch runs it at the end of its own import, after ``torch.distributed`` (which imports
    torchcomms) is complete. It never raises: a failure is reported on stderr and
    ``import torch`` goes on. Opt out with ``TORCHCOMM_C10D_AUTOLOAD=0`` (ours) or
    ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (every extension's); then call
    ``torchcomms.register_c10d_backends()`` to register by hand.
    """
    global _pending
    try:
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        if c10d is None or not hasattr(c10d, "Backend"):
            return  # a torch without torch.distributed: nothing to register with
        if _initializing("torchcomms_core") or _initializing("torch.distributed.distributed_c10d"):
            _pending = True
            return
        from torchcomms_core.c10d.names import autoload_registration

        autoload_registration()
    except Exception as exc:  # import torch must survive anything of ours
        print(f"torchcomms: autoload skipped: {exc!r}", file=sys.stderr)


def register_c10d_backends() -> list[str]:
    """Register every installed torchcomms backend with ``torch.distributed`` under its
    name (``Backend.register_backend``); return the names registered.

    torch's autoload does this at ``import torch``; call it yourself after opting out of
    the autoload, or after ``torchcomms.register_backend`` to make an in-process backend
    a ``torch.distributed`` name. Names c10d owns (gloo, nccl, mpi, ucc, xccl, fake) are
    left to c10d.
    """
    from torchcomms_core.c10d.names import register_c10d_backends as register

    return register()


def complete_torch_registration() -> None:
    """Give ``torch.distributed`` the torchcomms names its import could not find.

    ``torch.distributed`` looks torchcomms up while it is imported. When our package is
    imported first (``import torchcomms`` before ``import torch``), torch is imported
    from inside ours, finds it half-initialised, and turns
    ``TORCH_DISTRIBUTED_USE_TORCHCOMMS`` off for the whole process. Called once our
    package is complete, this sets what torch's own lookup would have set (see
    ``backend_wrapper.complete_registration``).
    """
    global _pending
    c10d: Any = sys.modules.get("torch.distributed.distributed_c10d")
    if _pending and c10d is not None and not _initializing("torch.distributed.distributed_c10d"):
        # torch's autoload ran while we were importing: register now that we are whole.
        _pending = False
        autoload()
    # Not imported yet, or still importing: nothing to complete, and the bridge stays
    # unloaded.
    if c10d is None or getattr(c10d, "_TORCHCOMM_AVAILABLE", True):
        return
    from torchcomms_core.c10d.backend_wrapper import complete_registration

    complete_registration()

"""The registrars that torch 2.14's c10d finds through the entry-point group
``torch.distributed.backends``.

c10d resolves a backend name it does not know (``init_process_group("shm")``,
``new_group(backend="cpu:hier")``) by loading the entry point of that name and calling what
it loads, with no argument, expecting it to register the name. Each backend distribution
publishes one entry point per name, pointing at the attribute of that name here::

    [project.entry-points."torch.distributed.backends"]
    shm = "torchcomms_core.c10d.registrars:shm"

and the attribute is a registrar made on demand for that name, so a vendor's wheel needs no
code of its own for it. The entry point works whatever ``TORCHCOMM_C10D_AUTOLOAD`` says: the
user named the backend. Names c10d owns (gloo, nccl, mpi, ucc, xccl, fake) are not
published; torch publishes its own.
"""

from __future__ import annotations

from collections.abc import Callable

from torchcomms_core.foundation import torch_compat
from torchcomms_core.foundation.errors import BackendNotFoundError

__all__ = ["registrar"]


def registrar(name: str) -> Callable[[], None]:
    """The no-argument registrar c10d calls for backend ``name``."""

    def register() -> None:
        torch_compat.check_tested()
        from torchcomms_core.c10d.names import register_c10d_backend

        if not register_c10d_backend(name):
            raise BackendNotFoundError(
                f"torch.distributed entry point {name!r}: torchcomms cannot register it with "
                "c10d (c10d owns the name, another library registered it first, or it is not "
                "a valid c10d backend name); `torchcomms backends` lists what is installed"
            )

    register.__name__ = register.__qualname__ = f"register_{name}"
    register.__doc__ = f"Register torchcomms backend {name!r} with torch.distributed."
    return register


def __getattr__(name: str) -> Callable[[], None]:
    if name.startswith("__"):
        raise AttributeError(name)
    return registrar(name)

"""Exceptions raised by torchcomms.

Every error a user can trigger derives from :class:`TorchCommError`; input errors are
also ``ValueError``/``TypeError`` so code written for ``torch.distributed`` catches them.
"""

from __future__ import annotations


class TorchCommError(RuntimeError):
    """Base class of every torchcomms error."""


class CommInputError(TorchCommError, ValueError):
    """An argument was refused before any communication took place."""


class CommTypeError(TorchCommError, TypeError):
    """An argument has the wrong Python type."""


class CommStateError(TorchCommError):
    """The communicator cannot run operations (finalized, aborted or failed)."""


class CommTimeoutError(TorchCommError, TimeoutError):
    """An operation did not complete within its timeout."""


class CommOperationError(TorchCommError):
    """An operation failed inside the backend (peer died, connection lost, ...)."""


class BackendNotFoundError(TorchCommError, LookupError, ModuleNotFoundError):
    """No backend is installed or registered under the requested name.

    Also a ``ModuleNotFoundError``, as the reference raises (its backends are modules).
    """


class BackendLoadError(TorchCommError):
    """A backend plugin is installed but could not be imported or is incompatible."""


class BootstrapError(TorchCommError):
    """Rank, world size or the rendezvous store could not be determined."""


class TransportNotFoundError(BackendNotFoundError, CommStateError):
    """No transport plugin is installed or registered under the requested name (or none
    at all). A :class:`BackendNotFoundError`, and a ``CommStateError`` as it was before."""

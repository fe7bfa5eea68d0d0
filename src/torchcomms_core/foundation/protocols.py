"""What the core's lower layers need of a communicator, as a ``Protocol``.

The work handle, the hook specifications and the plugin collectives' description are
below the communicator (``torchcomms_core.comm``) in the layers; they name a communicator
in their signatures through :class:`Communicator` instead of importing ``TorchComm``, so
no import circle exists, not even one of type annotations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


class Communicator(Protocol):
    """The public face of a communicator that lower layers use (a ``TorchComm`` is one).

    Only public members: no layer below the communicator reads one of its ``_`` members
    (``scripts/private_reaches.py`` checks it).
    """

    def get_name(self) -> str:
        """The communicator's name."""

    def get_rank(self) -> int:
        """This process's rank in the communicator."""

    def get_size(self) -> int:
        """The number of ranks."""

    def get_backend(self) -> str:
        """The backend name given to ``new_comm``."""

    def get_device(self) -> torch.device:
        """The communicator's device."""

    def is_aborted(self) -> bool:
        """Whether ``abort()`` ran."""

    def get_backend_impl(self) -> Any:
        """The backend object (a ``TorchCommBackend``): a work reads whether its
        ``wait_blocking()`` means anything (``supports_wait_blocking``) and whether an
        exception came from the plugin's own code."""

    def on_work_failure(self, work: Any, error: BaseException) -> None:
        """An engine failure ended ``work``, one of this communicator's works.

        ``TorchWork`` calls it on the communicator it holds, with the error its ``wait()``
        raises; the communicator marks itself failed, runs its abort hooks and, with
        ``abort_process_on_timeout_or_error``, aborts the process. A work built by hand
        around another object that lacks it (or ``get_backend_impl``) does without.
        """

"""The PyTorch releases torchcomms is tested on, and what differs between them, in one place.

The c10d bridge reaches into ``torch.distributed``'s internals, which change from one
release to the next. Every such difference the bridge follows is a name here, decided once
from the release in use; the bridge reads the name and never compares versions itself.

What differs, torch 2.13 against 2.14:

- c10d loads the ``torch.distributed.backends`` entry points by name: no; yes.
- under the switch, c10d asks ``torchcomms.is_backend_built`` before routing a name: no
  (every name goes to torchcomms); yes (a foreign c10d backend stays on c10d's path).
- ``c10d.Backend`` can be subclassed and constructed from Python: no; yes.
- a non-root ``gather`` under the switch passes as output: ``[]``; ``[[]]``.
- ``new_group(use_local_synchronization=True)`` under the switch: refused; built.
- ``torch.compile`` keeps the torchcomms ops in program order: yes; not always (a known
  failure, see :data:`COMPILE_KEEPS_COLLECTIVE_ORDER`).
- ``batch_isend_irecv`` brackets a Python group's operations in a coalescing block: no;
  yes, when the group's backend supports coalescing.
- under the switch, ``new_group`` builds a subgroup with ``new_comm`` over the store (its
  ``pg_options`` reach ``new_comm`` only flattened into strings); 2.13 splits the parent
  through the wrapper's ``split_group``.

A release outside :data:`TESTED` is refused by the bridge (``init_process_group`` on a
torchcomms backend, the switch, by-name registration) with a message that names the
tested releases; ``TORCHCOMM_ALLOW_UNTESTED_TORCH=1`` lets it go on at the user's risk.
The rest of torchcomms (``new_comm`` and the communicator) does not depend on c10d's
internals and is not refused.
"""

from __future__ import annotations

import os
import re

import torch

__all__ = [
    "ALLOW_UNTESTED",
    "BATCH_P2P_COALESCES_SUBCLASSES",
    "C10D_BACKEND_ENTRY_POINTS",
    "COMPILE_KEEPS_COLLECTIVE_ORDER",
    "PYTHON_C10D_BACKEND",
    "RELEASE",
    "SWITCH_ASKS_BACKEND_BUILT",
    "SWITCH_LOCAL_SYNCHRONIZATION",
    "TESTED",
    "UntestedTorchError",
    "check_tested",
    "parse_release",
    "tested_text",
    "untested_reason",
]

#: The (major, minor) releases of PyTorch the whole suite runs on in CI.
TESTED: tuple[tuple[int, int], ...] = ((2, 13), (2, 14))
#: Set to 1 to use the bridge on a release outside :data:`TESTED`.
ALLOW_UNTESTED = "TORCHCOMM_ALLOW_UNTESTED_TORCH"


def parse_release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string (``"2.14.1+cu130"`` gives ``(2, 14)``)."""
    match = re.match(r"^(\d+)\.(\d+)", str(version))
    if match is None:
        raise ValueError(f"not a PyTorch version: {version!r}")
    return int(match.group(1)), int(match.group(2))


#: The release of the torch in use.
RELEASE: tuple[int, int] = parse_release(torch.__version__)

#: c10d resolves a backend name it does not know through the entry-point group
#: ``torch.distributed.backends`` (``Backend._ensure_backend_registered``), so an installed
#: backend needs no registration at ``import torch``.
C10D_BACKEND_ENTRY_POINTS: bool = RELEASE >= (2, 14)
#: Under the switch, c10d routes a name to torchcomms only if ``torchcomms.is_backend_built``
#: or ``torchcomms._comms._is_backend_registered`` says so; a backend registered with c10d
#: by another library keeps c10d's own path (2.13 routes every name to torchcomms, which
#: wraps such a backend in a communicator).
SWITCH_ASKS_BACKEND_BUILT: bool = RELEASE >= (2, 14)
#: Under the switch, ``new_group(..., use_local_synchronization=True)`` builds the group
#: (2.13 raises ``NotImplementedError``, PyTorch's own refusal).
SWITCH_LOCAL_SYNCHRONIZATION: bool = RELEASE >= (2, 14)
#: ``batch_isend_irecv`` brackets a Python group's sends and receives in a coalescing block
#: when its backend supports coalescing (2.13 only brackets c10d's own ``ProcessGroup``
#: class, and the bridge reads the batch's length from the caller's frame).
BATCH_P2P_COALESCES_SUBCLASSES: bool = RELEASE >= (2, 14)
#: ``torch.compile`` keeps the torchcomms ops of a graph in program order (an effect token
#: threads through them). 2.14's inductor output carries no token, and a rank's blocking
#: ``recv`` was seen scheduled after a later ``all_to_all_v_single``: code that compiles
#: point-to-point calls followed by collectives can deadlock there. Not yet worked around.
COMPILE_KEEPS_COLLECTIVE_ORDER: bool = RELEASE < (2, 14)
#: ``torch._C._distributed_c10d.Backend`` has a Python constructor: a Python class can be a
#: c10d ``Backend`` and be registered in a ``ProcessGroup`` (``_register_backend``).
PYTHON_C10D_BACKEND: bool = RELEASE >= (2, 14)


class UntestedTorchError(RuntimeError):
    """The torch in use is not a release the c10d bridge is tested on."""


def tested_text() -> str:
    """The tested releases, as prose: ``"2.13 and 2.14"``."""
    names = [f"{major}.{minor}" for major, minor in TESTED]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def untested_reason(version: str | None = None) -> str:
    """Why the bridge refuses ``version`` (default: the torch in use); ``""`` if it does not."""
    version = str(torch.__version__) if version is None else version
    try:
        release = parse_release(version)
    except ValueError:
        release = (0, 0)
    if release in TESTED or os.environ.get(ALLOW_UNTESTED, "") == "1":
        return ""
    return (
        f"torch {version} is not a release the torchcomms c10d bridge is tested on "
        f"(torch {tested_text()}); c10d's internals change between releases, so it would fail "
        f"deep inside torch.distributed. Install a tested release (pip install "
        f"'torch=={TESTED[-1][0]}.{TESTED[-1][1]}.*'), or set {ALLOW_UNTESTED}=1 to try this one"
    )


def check_tested(version: str | None = None) -> None:
    """Raise :class:`UntestedTorchError` when the bridge does not know ``version``."""
    reason = untested_reason(version)
    if reason:
        raise UntestedTorchError(reason)

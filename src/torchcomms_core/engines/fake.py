"""``FakeBackend`` (backend name ``fake``): every operation completes at once, nothing is sent.

For unit-testing hooks, the flight recorder and NaN checks in one process, at any world size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch

from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import BootstrapError, CommInputError
from torchcomms_core.operations.reduce_op import RedOpType
from torchcomms_core.operations.table import DERIVED, names
from torchcomms_core.spec import DEFAULT_DTYPES, TorchCommBackend

if TYPE_CHECKING:
    from torchcomms_core.operations.options import CommOptions

#: The hints the fake backend reads (``new_comm("fake", ..., hints={"size": "8"})``).
RANK_HINT = "rank"
SIZE_HINT = "size"

# Every derivable operation the core hands a backend; the fake answers each with "done".
_OPERATIONS = names(support=DERIVED, issued=True)


def _int_hint(hints: dict[str, str], key: str) -> int | None:
    raw = hints.get(key)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise CommInputError(
            f"new_comm('fake'): hint {key}={raw!r} is not an integer; pass e.g. "
            f"hints={{'{SIZE_HINT}': '8', '{RANK_HINT}': '0'}}"
        ) from None


class FakeBackend(TorchCommBackend):
    """A communicator that never communicates: every operation returns completed.

    Outputs are left untouched (an in-place ``all_reduce`` keeps the caller's values, a
    receive keeps what the buffer held), so results are meaningless but every call,
    hook, flight-recorder entry, work status and argument check behaves as on a real
    backend. Rank and size come from the hints ``rank`` and ``size``, else from the
    launcher's environment, else rank 0 of 1; ``split`` gives children of the requested
    size. Any device type is accepted.
    """

    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda", "meta", "mtia", "xpu", "hpu")
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = DEFAULT_DTYPES + (
        torch.complex64,
        torch.complex128,
    )
    # Declared native so the core does not derive AVG/PREMUL_SUM (which would write).
    supported_reduce_ops: ClassVar[frozenset[RedOpType]] = frozenset(RedOpType)
    needs_store: ClassVar[bool] = False
    hint_keys: ClassVar[tuple[str, ...] | None] = (RANK_HINT, SIZE_HINT)
    #: Results are not those of a real collective: the conformance suite's numerical
    #: contracts do not apply.
    communicates: ClassVar[bool] = False

    @classmethod
    def own_rank_size(cls, hints: dict[str, str]) -> tuple[int, int] | None:
        size = _int_hint(hints, SIZE_HINT)
        rank = _int_hint(hints, RANK_HINT)
        if size is None and rank is None:
            try:
                found = _env.rank_and_size()
            except ValueError as exc:
                raise BootstrapError(str(exc)) from None
            return found[:2] if found is not None else (0, 1)
        size = 1 if size is None else size
        rank = 0 if rank is None else rank
        if size < 1 or not 0 <= rank < size:
            raise CommInputError(
                f"new_comm('fake'): rank {rank} of size {size} is not valid; pass a size >= 1 "
                f"and a rank in 0..size-1"
            )
        return rank, size

    def init(self, device: torch.device, name: str, options: CommOptions) -> None:
        self._rank, self._size = options.rank, options.size
        self._name = name

    def finalize(self) -> None:
        """Nothing to release."""

    def abort(self) -> None:
        """Nothing is in flight."""

    def get_rank(self) -> int:
        return self._rank

    def get_size(self) -> int:
        return self._size

    def get_backend_name(self) -> str:
        return "fake"

    def get_comm_name(self) -> str:
        return self._name

    def _completed(self, *args: Any, **kwargs: Any) -> Any:
        """Completed at once; nothing was sent or received."""
        return None

    send = recv = _completed


for _name in _OPERATIONS:
    setattr(FakeBackend, _name, FakeBackend._completed)
del _name

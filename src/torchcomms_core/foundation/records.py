"""Reading a record another rank published in the store: JSON of a known shape, or an error.

Every value a rank reads from the store was written by a peer, or by anyone who reaches the
store's port (docs/security.md). :func:`read_record` turns such a value into a ``dict``
whose fields have the types the reader expects, or raises a :class:`CommStateError` naming
the key; no input makes it raise anything else, recurse without bound or allocate more
than the value's own size.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from torchcomms_core.foundation.errors import CommStateError

__all__ = ["MAX_RECORD_BYTES", "read_record"]

#: The largest record a rank reads (rank records are a few hundred bytes).
MAX_RECORD_BYTES = 1 << 20
#: JSON nesting beyond this is refused before the decoder recurses into it.
_MAX_DEPTH = 32

Types = type | tuple[type, ...]


def read_record(raw: Any, key: str, fields: Mapping[str, Types]) -> dict[str, Any]:
    """The JSON object in ``raw`` (the bytes read under ``key``), with every field of
    ``fields`` present and of its type (``int`` excludes ``bool``; ``type(None)`` allows
    ``null``). Other fields are kept as they are.

    Raises:
        CommStateError: ``raw`` is not such a record (naming ``key`` and what is wrong).
    """
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise _malformed(key, f"it is a {type(raw).__name__}, not bytes")
    data = bytes(raw)
    if len(data) > MAX_RECORD_BYTES:
        raise _malformed(key, f"it holds {len(data)} bytes, over {MAX_RECORD_BYTES}")
    depth = 0
    for byte in data:  # bound the nesting before json recurses
        if byte in b"[{":
            depth += 1
            if depth > _MAX_DEPTH:
                raise _malformed(key, f"it nests deeper than {_MAX_DEPTH} levels")
        elif byte in b"]}":
            depth = max(depth - 1, 0)
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise _malformed(key, f"it is not JSON ({type(exc).__name__}: {str(exc)[:80]})") from None
    if not isinstance(value, dict):
        raise _malformed(key, f"it holds a {type(value).__name__}, not an object")
    for name, kinds in fields.items():
        if name not in value:
            raise _malformed(key, f"field {name!r} is missing")
        field = value[name]
        allowed = kinds if isinstance(kinds, tuple) else (kinds,)
        if isinstance(field, bool) and bool not in allowed:
            ok = False
        else:
            ok = isinstance(field, allowed)
        if not ok:
            want = " or ".join(k.__name__ for k in allowed)
            raise _malformed(key, f"field {name!r} is a {type(field).__name__}, not {want}")
    return value


def _malformed(key: str, why: str) -> CommStateError:
    return CommStateError(
        f"store entry {key!r} is not a record a rank of this communicator writes ({why}); "
        f"something other than its ranks wrote it, or the ranks run different versions of "
        f"torchcomms. Set TORCHCOMM_JOB_TOKEN on every rank so only members can write the "
        f"store (docs/security.md), and install one version everywhere"
    )

"""The job token: a store whose entries only members of this job can write.

With ``TORCHCOMM_JOB_TOKEN`` (or the hint ``job_token``) set, ``new_comm`` wraps the store
it hands the communicator and its backend in a :class:`SigningStore`, once. It is a c10d
``Store`` written in Python, so PyTorch's C++ users of a store (gloo's process group, a
``PrefixStore`` built over it) go through it as well.

- **Values.** Every value written carries an HMAC-SHA256 over the key and the value, under
  a key derived from the token, the job's id (``TORCHELASTIC_RUN_ID`` or ``SLURM_JOB_ID``)
  and its attempt (``TORCHELASTIC_RESTART_COUNT``): an entry copied from another job or an
  earlier attempt does not verify. Every read verifies; an entry that does not raises a
  :class:`CommStateError` naming the key, and its value is never returned.
- **Key names.** Every key is stored under its name followed by a tag derived from the
  same secret, so a stranger who cannot watch the store's traffic does not know which
  keys the job uses. That is what protects counters (``add``): the store computes them,
  so they cannot carry a signature. A stranger who watches the traffic learns the names
  and can change a counter or create a key a rank only waits for (``wait`` does not read
  the value), which can make a barrier release early or time out, but never makes a rank
  use a value that a member did not write.
- **Appends** are signed chunk by chunk (each chunk is a record of its own length, MAC and
  bytes), so a read verifies every chunk: a stranger who learnt the key's name can repeat,
  drop or reorder the chunks members appended, never add one of its own.

The token itself is kept nowhere: only the derived key is, and ``repr`` shows neither.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from torch._C._distributed_c10d import PrefixStore, Store

from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import CommInputError, CommStateError

__all__ = [
    "HINT",
    "SigningStore",
    "decode_value",
    "derive_key",
    "job_token",
    "signed",
]

#: The hint that gives the job token (``TORCHCOMM_JOB_TOKEN`` gives it too).
HINT = "job_token"
#: Environment variables that name the job, in order of preference.
JOB_ID_VARS = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID")

_SET = b"tcS1"  # one signed value: magic, MAC, value
_APPEND = b"tcA1"  # one signed chunk of an appended value: magic, length, MAC, chunk
_MAC = 32
_LEN = struct.Struct(">I")
_TAG_BYTES = 10  # 20 hex characters appended to every key name
#: The least a token must hold, so it cannot be guessed by trying.
MIN_TOKEN_BYTES = 16


def job_token(hints: dict[str, str] | None) -> bytes | None:
    """The job token from the hint ``job_token`` (which wins) or the environment, or ``None``.

    Raises:
        CommInputError: the token is shorter than :data:`MIN_TOKEN_BYTES` bytes (the
            message never shows it).
    """
    raw = (hints or {}).get(HINT)
    where = f"the hint {HINT!r}"
    if raw is None:
        raw = os.environ.get(_env.JOB_TOKEN)
        where = _env.JOB_TOKEN
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str):
        raise CommInputError(f"{where} must be a string (its value is not shown)")
    data = raw.encode()
    if len(data) < MIN_TOKEN_BYTES:
        raise CommInputError(
            f"{where} holds {len(data)} bytes; a job token needs at least {MIN_TOKEN_BYTES} "
            f"random bytes (e.g. `export {_env.JOB_TOKEN}=$(openssl rand -hex 32)` in the "
            f"script that launches every rank)"
        )
    return data


def job_id() -> str:
    """What names this job to the launcher (empty when no launcher variable is set)."""
    for name in JOB_ID_VARS:
        value = os.environ.get(name, "")
        if value:
            return f"{name}={value}"
    return ""


def derive_key(token: bytes, job: str | None = None, attempt: int | None = None) -> bytes:
    """The signing key of this job and attempt, derived from ``token`` (which it hides)."""
    job = job_id() if job is None else job
    attempt = _env.restart_count() if attempt is None else attempt
    context = b"torchcomms store v1\0" + job.encode() + b"\0" + str(attempt).encode()
    return hmac.new(token, context, hashlib.sha256).digest()


def _mac(key: bytes, name: str, value: bytes) -> bytes:
    encoded = name.encode()
    message = b"v" + _LEN.pack(len(encoded)) + encoded + value
    return hmac.new(key, message, hashlib.sha256).digest()


def signed(key: bytes, name: str, value: bytes) -> bytes:
    """``value`` as stored under ``name``: magic, MAC, value."""
    return _SET + _mac(key, name, value) + value


def _chunk(key: bytes, name: str, value: bytes) -> bytes:
    mac = _mac(key, "append:" + name, value)
    return _APPEND + _LEN.pack(len(value)) + mac + value


def decode_value(key: bytes, name: str, data: bytes) -> bytes:
    """The value a member wrote under ``name``, from the stored ``data``.

    Raises:
        CommStateError: ``data`` is not a value signed under ``key`` for ``name`` (forged,
            corrupted, or copied from another job, attempt or key).
    """
    data = bytes(data)
    if data.startswith(_SET) and len(data) >= len(_SET) + _MAC:
        mac, value = data[len(_SET) : len(_SET) + _MAC], data[len(_SET) + _MAC :]
        if hmac.compare_digest(mac, _mac(key, name, value)):
            return value
        raise _untrusted(name, "its signature does not verify")
    if data.startswith(_APPEND):
        return _decode_chunks(key, name, data)
    raise _untrusted(name, f"it carries no signature ({len(data)} bytes)")


def _decode_chunks(key: bytes, name: str, data: bytes) -> bytes:
    parts: list[bytes] = []
    pos = 0
    head = len(_APPEND) + _LEN.size + _MAC
    while pos < len(data):
        if data[pos : pos + len(_APPEND)] != _APPEND or len(data) - pos < head:
            raise _untrusted(name, f"an appended chunk at byte {pos} is malformed")
        (size,) = _LEN.unpack_from(data, pos + len(_APPEND))
        mac = data[pos + len(_APPEND) + _LEN.size : pos + head]
        if size > len(data) - pos - head:
            raise _untrusted(name, f"an appended chunk at byte {pos} is cut short")
        value = data[pos + head : pos + head + size]
        if not hmac.compare_digest(mac, _mac(key, "append:" + name, value)):
            raise _untrusted(name, f"the appended chunk at byte {pos} does not verify")
        parts.append(value)
        pos += head + size
    return b"".join(parts)


def _untrusted(name: str, why: str) -> CommStateError:
    return CommStateError(
        f"store entry {name!r} was not written by a member of this job ({why}), so no rank "
        f"uses it. Something other than this job's ranks writes to its store: keep the "
        f"store's address off networks other jobs share, or check that every rank has the "
        f"same {_env.JOB_TOKEN}, {_env.RESTART_COUNT} and job id "
        f"({' / '.join(JOB_ID_VARS)})"
    )


def _bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, list):  # c10d passes std::vector<uint8_t> as a list of ints
        return bytes(value)
    return str(value).encode()


class SigningStore(Store):
    """A c10d ``Store`` over ``inner`` that signs every value it writes and verifies every
    value it reads (module docstring). Made by :func:`signing_store`; ``failure`` holds the
    first entry that did not verify, for an error that crossed C++ code on its way out.
    """

    def __init__(self, inner: Any, key: bytes) -> None:
        super().__init__()
        self._inner = inner
        self.__key = key
        self._lock = threading.Lock()
        self.failure: CommStateError | None = None

    def __repr__(self) -> str:
        return "SigningStore(<job token hidden>)"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("a SigningStore holds the job's key and cannot be pickled")

    @property
    def inner(self) -> Any:
        """The store the entries live in."""
        return self._inner

    def over(self, inner: Any) -> SigningStore:
        """A signing store over ``inner`` with this one's key (a second connection of the
        same job, e.g. to another member's rendezvous)."""
        return SigningStore(inner, self.__key)

    def physical(self, name: str) -> str:
        """The name ``name`` is stored under: ``name`` and a tag only members can compute."""
        tag = hmac.new(self.__key, b"k" + name.encode(), hashlib.sha256).digest()[:_TAG_BYTES]
        return f"{name}/~{tag.hex()}"

    def _open(self, name: str, data: Any) -> bytes:
        try:
            return decode_value(self.__key, name, _bytes(data))
        except CommStateError as exc:
            with self._lock:
                if self.failure is None:
                    self.failure = exc
            raise

    def set(self, key: str, value: Any) -> None:
        self._inner.set(self.physical(key), signed(self.__key, key, _bytes(value)))

    def get(self, key: str) -> bytes:
        return self._open(key, self._inner.get(self.physical(key)))

    def add(self, key: str, value: int) -> int:
        return int(self._inner.add(self.physical(key), value))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        old = _bytes(expected)
        old = signed(self.__key, key, old) if old else b""
        new = signed(self.__key, key, _bytes(desired))
        return self._open(key, self._inner.compare_set(self.physical(key), old, new))

    def append(self, key: str, value: Any) -> None:
        self._inner.append(self.physical(key), _chunk(self.__key, key, _bytes(value)))

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        values = self._inner.multi_get([self.physical(k) for k in keys])
        return [self._open(k, v) for k, v in zip(keys, values, strict=True)]

    def multi_set(self, keys: Sequence[str], values: Sequence[Any]) -> None:
        data = [signed(self.__key, k, _bytes(v)) for k, v in zip(keys, values, strict=True)]
        self._inner.multi_set([self.physical(k) for k in keys], data)

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        names = [self.physical(k) for k in keys]
        if timeout is None:
            self._inner.wait(names)
        else:
            self._inner.wait(names, timeout)

    def check(self, keys: Sequence[str]) -> bool:
        return bool(self._inner.check([self.physical(k) for k in keys]))

    def delete_key(self, key: str) -> bool:
        return bool(self._inner.delete_key(self.physical(key)))

    def num_keys(self) -> int:
        return int(self._inner.num_keys())

    def set_timeout(self, timeout: timedelta) -> None:
        super().set_timeout(timeout)
        self._inner.set_timeout(timeout)

    def has_extended_api(self) -> bool:
        return True


#: Added to a creation timeout when this rank signs its entries.
TOKEN_ADVICE = (
    f"With {_env.JOB_TOKEN} set, ranks whose token, job id or attempt differ never see each "
    f"other's store entries: check that every rank has the same {_env.JOB_TOKEN}, "
    f"{_env.RESTART_COUNT} and job id ({' / '.join(JOB_ID_VARS)})"
)


def is_signed(store: Any) -> bool:
    """Whether ``store`` is a :class:`SigningStore` or a ``PrefixStore`` chain over one."""
    return find_signer(store) is not None


def signing_store(store: Any, hints: dict[str, str] | None) -> Any:
    """``store`` wrapped in a :class:`SigningStore` when the job has a token, else itself.

    A store already signed (itself, or prefixes over one) is returned as it is.
    """
    token = job_token(hints)
    if token is None or store is None or is_signed(store):
        return store
    return SigningStore(store, derive_key(token))


def find_signer(store: Any) -> SigningStore | None:
    """The :class:`SigningStore` under ``store``'s prefixes, or ``None``."""
    for _ in range(64):
        if isinstance(store, SigningStore):
            return store
        if not isinstance(store, PrefixStore):
            return None
        store = store.underlying_store
    return None


def signing_failure(store: Any) -> CommStateError | None:
    """The first entry ``store`` (or the signing store under its prefixes) refused."""
    signer = find_signer(store)
    return signer.failure if signer is not None else None


def sign_like(reference: Any, inner: Any) -> Any:
    """``inner`` signed as ``reference`` is (with the same key), or ``inner`` itself when
    ``reference`` is not signed."""
    signer = find_signer(reference)
    return signer.over(inner) if signer is not None else inner

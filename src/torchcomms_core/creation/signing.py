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
- **Alarm.** A rank that refuses an entry sets a signed job-wide alarm naming it. A rank
  blocked reading or waiting on the store looks at the alarm while it waits (it polls with
  ``check``, from 0.5 ms doubling up to 50 ms, rather than one blocking ``wait``; a read
  of a key already set costs one ``check`` before its ``get``), so every
  rank fails within a fraction of a second with the same ``CommStateError``, not only the
  ranks that read the forged entry.
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
import time
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
    "refusal",
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
#: The job-wide key a rank sets, signed, when it refuses an entry (its value: the entry's key).
ALARM_KEY = "torchcomms/untrusted"
#: Every rank that fails on a refusal adds one here; the store's host waits for them all.
SEEN_KEY = "torchcomms/untrusted_seen"
#: A blocked read polls the awaited keys from this interval, doubling up to the next.
POLL_FIRST_S = 0.0005
POLL_MAX_S = 0.05
#: ... and looks at the alarm this often.
ALARM_EVERY_S = 0.2


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
                first = self.failure is None
                if first:
                    self.failure = exc
            if first and name != ALARM_KEY:
                self._sound_alarm(name)
            raise

    def _sound_alarm(self, name: str) -> None:
        """Tell every member that ``name`` held an entry no member wrote (best effort: the
        rank raises its own error whether or not the store takes the alarm)."""
        try:
            self._inner.set(self.physical(ALARM_KEY), signed(self.__key, ALARM_KEY, name.encode()))
        except Exception:  # noqa: BLE001 - the refusal itself is what this rank reports
            pass

    def alarm(self) -> CommStateError | None:
        """The error of the entry a member refused, when one did (``None`` otherwise)."""
        if self.failure is not None:
            return self.failure
        name = self.physical(ALARM_KEY)
        if not self._inner.check([name]):
            return None
        try:
            refused = decode_value(self.__key, ALARM_KEY, _bytes(self._inner.get(name)))
        except CommStateError as exc:  # the alarm itself forged: refused like any entry
            error = exc
        else:
            what = refused.decode(errors="replace")[:200]
            error = _untrusted(what, "a member of this job read it and refused it")
        with self._lock:
            if self.failure is None:
                self.failure = error
        return self.failure

    def acknowledge(self) -> None:
        """Count this rank among those that failed on the refusal (best effort)."""
        try:
            self._inner.add(self.physical(SEEN_KEY), 1)
        except Exception:  # noqa: BLE001 - the store gone: nobody is left to wait for it
            pass

    def linger(self, size: int, seconds: float) -> None:
        """Keep this process (the store's host) until all ``size`` ranks failed on the
        refusal, or ``seconds`` passed: its store is where the others learn why."""
        deadline = time.monotonic() + seconds
        name = self.physical(SEEN_KEY)
        while time.monotonic() < deadline:
            try:
                if int(self._inner.add(name, 0)) >= size:
                    return
            except Exception:  # noqa: BLE001 - the store gone: nothing to keep alive
                return
            time.sleep(0.01)

    def _await(self, names: list[str], timeout: timedelta | None) -> None:
        """Return when every key in ``names`` (physical) is set; raise the alarm's error as
        soon as a member refused an entry, and the store's own timeout error when the
        timeout passes first."""
        if self._inner.check(names):
            return
        limit = (timeout if timeout is not None else self._inner.timeout).total_seconds()
        start = time.monotonic()
        deadline = start + limit
        delay = POLL_FIRST_S
        alarm_at = start + ALARM_EVERY_S
        while True:
            now = time.monotonic()
            if now >= alarm_at:
                error = self.alarm()
                if error is not None:
                    raise error
                alarm_at = now + ALARM_EVERY_S
            left = deadline - now
            if left <= delay:  # the last stretch as one wait: the store's own timeout error
                self._inner.wait(names, timedelta(seconds=max(left, 0.001)))
                return
            time.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)
            if self._inner.check(names):
                return

    def set(self, key: str, value: Any) -> None:
        self._inner.set(self.physical(key), signed(self.__key, key, _bytes(value)))

    def get(self, key: str) -> bytes:
        name = self.physical(key)
        self._await([name], None)
        return self._open(key, self._inner.get(name))

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
        names = [self.physical(k) for k in keys]
        self._await(names, None)
        values = self._inner.multi_get(names)
        return [self._open(k, v) for k, v in zip(keys, values, strict=True)]

    def multi_set(self, keys: Sequence[str], values: Sequence[Any]) -> None:
        data = [signed(self.__key, k, _bytes(v)) for k, v in zip(keys, values, strict=True)]
        self._inner.multi_set([self.physical(k) for k in keys], data)

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        self._await([self.physical(k) for k in keys], timeout)

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
    """The first entry ``store`` (or the signing store under its prefixes) refused, or the
    one another member refused and raised the alarm for (a rank that failed for another
    reason, a peer's connection closing under it, learns why the job failed)."""
    return _failure_of(find_signer(store))


def _failure_of(signer: SigningStore | None) -> CommStateError | None:
    if signer is None:
        return None
    try:
        return signer.alarm()
    except Exception:  # noqa: BLE001 - the store itself gone: only what this rank saw
        return signer.failure


def refusal(store: Any, size: int, timeout: timedelta, host: bool) -> CommStateError | None:
    """The refusal that failed this rank's creation (:func:`signing_failure`), once this
    rank is counted among the ranks that failed on it; the store's host (``host``) first
    waits, at most ``timeout``, until every rank has, so that none of them loses the store
    (and the alarm in it) before it learnt why the job failed."""
    signer = find_signer(store)
    error = _failure_of(signer)
    if error is None or signer is None:
        return None
    signer.acknowledge()
    if host:
        signer.linger(size, timeout.total_seconds())
    return error


def sign_like(reference: Any, inner: Any) -> Any:
    """``inner`` signed as ``reference`` is (with the same key), or ``inner`` itself when
    ``reference`` is not signed."""
    signer = find_signer(reference)
    return signer.over(inner) if signer is not None else inner

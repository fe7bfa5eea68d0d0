"""Parsers that no input can crash: property-based tests of every decoder of bytes that come
from the store or a socket (docs/security.md).

Each parser is fed arbitrary input and mutations of well-formed input; it must return a
value or raise its documented error, nothing else. ``TORCHCOMM_FUZZ_EXAMPLES`` sets the
examples per parser (CI: the default, 300; a one-off deep run: 100000).
"""

from __future__ import annotations

import json
import os
import re
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchcomms_core.comm import reconfigure
from torchcomms_core.creation import signing
from torchcomms_core.creation.rendezvous import Handle, parse_handle
from torchcomms_core.foundation.errors import (
    CommInputError,
    CommOperationError,
    CommStateError,
    CommTimeoutError,
)
from torchcomms_core.foundation.records import MAX_RECORD_BYTES, read_record

EXAMPLES = int(os.environ.get("TORCHCOMM_FUZZ_EXAMPLES", "300"))
fuzz = settings(
    max_examples=EXAMPLES,
    deadline=timedelta(seconds=2),  # no input may make a parser slow, let alone hang
    suppress_health_check=list(HealthCheck),
    database=None,
)


def mutated(good: bytes) -> st.SearchStrategy[bytes]:
    """``good`` with bytes flipped, cut, inserted or repeated."""

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        data = bytearray(good)
        for _ in range(draw(st.integers(0, 4))):
            op = draw(st.sampled_from(["flip", "cut", "insert", "repeat"]))
            pos = draw(st.integers(0, max(len(data) - 1, 0)))
            if op == "flip" and data:
                data[pos] ^= 1 << draw(st.integers(0, 7))
            elif op == "cut":
                del data[pos:]
            elif op == "insert":
                data[pos:pos] = draw(st.binary(max_size=16))
            else:
                data[pos:pos] = data[pos : pos + draw(st.integers(1, 64))] * draw(st.integers(1, 8))
        return bytes(data)

    return build()


def json_values() -> st.SearchStrategy[object]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=12,
    )


# -- init handles ------------------------------------------------------------------------


HANDLE_PARTS = st.text(alphabet="gloshm:[]0123456789.-abcdef", max_size=40)


@fuzz
@given(text=HANDLE_PARTS | st.text(max_size=80) | st.binary(max_size=20) | st.integers())
def test_init_handles(text: object) -> None:
    for hosted in (False, True):
        try:
            handle = parse_handle(text, "gloo", hosted, "reconfigure: init_handles[0]")
        except CommInputError:
            continue
        assert isinstance(handle, Handle) and handle.backend == "gloo"
        assert (handle.host is not None) == hosted
        if hosted:
            assert 0 < handle.port < 65536
            assert parse_handle(str(handle), "gloo", True, "again") == handle


# -- signed store entries ----------------------------------------------------------------

KEY = signing.derive_key(b"fuzzing-token-0123456789", "", 0)
SIGNED = signing.signed(KEY, "comm/x/0/1", b"127.0.0.1:29500")
CHUNKS = signing._chunk(KEY, "d", b"a,") + signing._chunk(KEY, "d", b"bb,")


@fuzz
@given(
    data=st.binary(max_size=256)
    | mutated(SIGNED)
    | mutated(CHUNKS)
    | st.builds(lambda b: b"tcA1" + b, st.binary(max_size=64))
)
def test_signed_entries(data: bytes) -> None:
    for name in ("comm/x/0/1", "d"):
        try:
            value = signing.decode_value(KEY, name, data)
        except CommStateError as exc:
            assert repr(name) in str(exc) and "not written by a member" in str(exc)
            continue
        # Only what a member wrote verifies: the value, or for an appended key a sequence
        # of the chunks members appended (a stranger who learnt the name can repeat, drop
        # or reorder chunks, never add its own).
        if name == "comm/x/0/1":
            assert (data, value) == (SIGNED, b"127.0.0.1:29500")
        else:
            assert re.fullmatch(rb"(a,|bb,)*", value), value


# -- records: hier topology, shm host identity, window and transport metadata ------------

SCHEMAS = {
    "hier status": (
        dict.fromkeys(
            ("host", "local", "global", "local_kind", "local_msg", "global_kind", "global_msg"),
            str,
        ),
        {
            "host": "h",
            "local": "shm",
            "global": "gloo",
            "local_kind": "ok",
            "local_msg": "",
            "global_kind": "ok",
            "global_msg": "",
        },
    ),
    "shm hello": (
        {"host": str, "arena": int, "p2p": int},
        {"host": "boot-id", "pid": 1, "start": 2, "arena": 4096, "p2p": 0, "cma": 0},
    ),
    "shm segment": ({"name": str, "token": str}, {"name": "torchcomms-1", "token": "ab"}),
    "window segment": ({"path": str, "numel": int}, {"path": "/dev/shm/x", "numel": 8}),
    "window mode": (
        {"mode": str, "host": str, "probe": (list, type(None))},
        {"mode": "auto", "host": "h", "probe": None},
    ),
    "transport window": (
        {"numel": int, "data": list, "counters": list, "urls": dict},
        {"numel": 1, "data": [1, 2, "DRAM"], "counters": [3, 4, "DRAM"], "urls": {"1": "eA=="}},
    ),
}


SCHEMAS.update(
    {
        "reconfigure member": (reconfigure._MEMBER, {"rank": 0, "digest": "ab"}),
        "reconfigure list": (reconfigure._LIST, {"rank": 0, "handles": ["gloo:0:t"]}),
        "reconfigure announcement": (
            reconfigure._ANNOUNCEMENT,
            {"uuid": "u", "state": "pending", "seq": 1, "against": ""},
        ),
    }
)


@fuzz
@given(raw=st.binary(max_size=100) | json_values().map(lambda v: json.dumps(v).encode()))
def test_reconfigure_outcomes(raw: bytes) -> None:
    try:
        reconfigure._raise_outcome(raw)
    except (CommStateError, CommInputError, CommTimeoutError, CommOperationError):
        pass


@pytest.mark.parametrize("schema", list(SCHEMAS))
def test_records(schema: str) -> None:
    fields, example = SCHEMAS[schema]
    good = json.dumps(example).encode()

    @fuzz
    @given(
        raw=st.binary(max_size=200)
        | mutated(good)
        | json_values().map(lambda v: json.dumps(v).encode())
        | st.fixed_dictionaries({k: json_values() for k in fields}).map(
            lambda v: json.dumps(v).encode()
        )
        | st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n)
    )
    def check(raw: bytes) -> None:
        try:
            record = read_record(raw, "k/1", fields)
        except CommStateError as exc:
            assert "'k/1'" in str(exc)
            return
        for name, kinds in fields.items():
            allowed = kinds if isinstance(kinds, tuple) else (kinds,)
            assert isinstance(record[name], allowed)
            assert not isinstance(record[name], bool) or bool in allowed

    check()
    assert read_record(good, "k/1", fields) == example


def test_records_refuse_deep_nesting_and_huge_values() -> None:
    with pytest.raises(CommStateError, match="nests deeper"):
        read_record(b"[" * 100000 + b"]" * 100000, "k", {})
    with pytest.raises(CommStateError, match="bytes, over"):
        read_record(b" " * (MAX_RECORD_BYTES + 1), "k", {})


# -- gloo's peer addresses ---------------------------------------------------------------


def _gloo_value(port: int) -> bytes:
    import socket
    import struct

    addr = struct.pack("=H", socket.AF_INET) + struct.pack(">H", port) + bytes([127, 0, 0, 1])
    addr += bytes(120) + struct.pack("<Q", 7)
    host = b"localhost"
    return struct.pack("<Q", len(host)) + host + struct.pack("<Q", len(addr)) + addr


@fuzz
@given(value=st.binary(max_size=300) | mutated(_gloo_value(29500)))
def test_gloo_peer_addresses(value: bytes) -> None:
    peer_addresses = pytest.importorskip("torchcomms_gloo.peer_addresses")
    found = peer_addresses.parse_address(value)
    assert found is None or (isinstance(found[0], str) and 0 < found[1] < 65536)


# -- nixl: addresses, access keys, notifications -----------------------------------------


@fuzz
@given(
    url=st.binary(max_size=200),
    body=json_values(),
    text=st.text(max_size=120),
)
def test_nixl_addresses_keys_and_notifications(url: bytes, body: object, text: str) -> None:
    keys = pytest.importorskip("torchcomms_nixl.keys")
    wire = pytest.importorskip("torchcomms_nixl.wire")
    raw = json.dumps(body).encode()
    for candidate in (url, keys.URL_PREFIX + url, keys.URL_PREFIX + raw):
        try:
            keys.decode_address(candidate)
        except CommInputError:
            pass
    import base64

    for candidate in (
        text,
        keys.KEY_PREFIX + text,
        keys.KEY_PREFIX + base64.urlsafe_b64encode(raw).decode(),
    ):
        try:
            keys.decode_key("get", candidate)
        except CommInputError:
            pass
    for message in (wire.TAG + url, wire.TAG + raw):
        assert isinstance(wire.decode(message), dict)


def test_nixl_keys_refuse_infinite_numbers() -> None:
    keys = pytest.importorskip("torchcomms_nixl.keys")
    with pytest.raises(CommInputError):
        keys.decode_address(keys.URL_PREFIX + b'{"agent":"a","endpoint":Infinity,"md":""}')

"""The core's transport API (``torchcomms._transport``) when no transport, an unusable one or an
incompatible one is installed; transfers themselves are tested with torchcomms-nixl
(plugins/torchcomms_nixl/tests).
"""

from __future__ import annotations

import pickle
from datetime import timedelta
from typing import ClassVar

import pytest
import torch

import torchcomms
from torchcomms._transport import (
    RdmaMemory,
    RdmaRemoteBuffer,
    RdmaTransport,
    attach_rdma_memory_hook,
)
from torchcomms_core.plugin_host import transports as _transport
from torchcomms_core.spec.transport import (
    MemoryRegistration,
    TransportEndpoint,
    TransportProvider,
)


class _Unusable(TransportProvider):
    name: ClassVar[str] = "unusable"

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        return False, "its engine is missing (test)"

    def endpoint(self, device: torch.device, timeout: timedelta) -> TransportEndpoint:
        raise AssertionError("never asked")

    def register(self, tensor: torch.Tensor) -> MemoryRegistration:
        raise AssertionError("never asked")


class _FromTheFuture(_Unusable):
    name: ClassVar[str] = "future"
    spec_version: ClassVar[str] = "2.0"


@pytest.fixture
def no_installed_transports(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in an environment without any transport plugin."""
    monkeypatch.setattr(_transport.TRANSPORTS, "entry_points", lambda: {})
    monkeypatch.setattr(_transport.TRANSPORTS, "_registered", {})
    monkeypatch.delenv("TORCHCOMM_TRANSPORT", raising=False)


def test_without_a_transport_supported_is_false_and_constructors_say_what_to_install(
    no_installed_transports: None,
) -> None:
    assert RdmaTransport.supported() is False
    for make in (lambda: RdmaTransport(torch.device("cpu")), lambda: RdmaMemory(torch.zeros(4))):
        with pytest.raises(torchcomms.CommStateError, match="pip install torchcomms-nixl"):
            make()
    assert torchcomms.available_transports() == []


def test_an_unavailable_transport_is_not_supported_and_says_why(
    no_installed_transports: None,
) -> None:
    torchcomms.register_transport("unusable", _Unusable)
    try:
        assert RdmaTransport.supported() is False
        with pytest.raises(torchcomms.CommStateError, match="its engine is missing"):
            RdmaTransport(torch.device("cpu"))
        (row,) = _transport.describe_transports()
        assert row["name"] == "unusable" and row["runnable"] is False
        assert "its engine is missing" in row["reason"] and row["selected"] is True
    finally:
        torchcomms.unregister_transport("unusable")


def test_an_incompatible_spec_version_is_refused_at_registration() -> None:
    with pytest.raises(torchcomms.BackendLoadError, match="targets transport spec 2.0"):
        torchcomms.register_transport("future", _FromTheFuture)
    with pytest.raises(torchcomms.BackendLoadError, match="not a subclass"):
        torchcomms.register_transport("nothing", object)  # type: ignore[arg-type]


def test_an_unknown_transport_name_lists_what_is_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHCOMM_TRANSPORT", "nosuch")
    assert RdmaTransport.supported() is False
    with pytest.raises(torchcomms.CommStateError, match="no torchcomms transport named 'nosuch'"):
        RdmaTransport(torch.device("cpu"))
    # One family of errors with backends: a not-found error, still a CommStateError.
    with pytest.raises(torchcomms.BackendNotFoundError) as caught:
        RdmaMemory(torch.zeros(4))
    assert isinstance(caught.value, torchcomms.TransportNotFoundError)
    assert "pick another with TORCHCOMM_TRANSPORT" in str(caught.value)


def test_the_cli_lists_no_transports_with_a_hint(
    no_installed_transports: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchcomms_core.cli import main

    assert main(["transports"]) == 0
    assert "pip install torchcomms-nixl" in capsys.readouterr().out


def test_remote_buffers_pickle_as_their_three_fields() -> None:
    buf = RdmaRemoteBuffer(4096, 128, "key")
    assert pickle.loads(pickle.dumps(buf)) == buf
    assert buf.__reduce__() == (RdmaRemoteBuffer, (4096, 128, "key"))
    assert "len=128" in repr(buf)


def test_the_allocator_hook_is_refused_with_what_to_do_instead() -> None:
    with pytest.raises(torchcomms.CommStateError, match="registers memory per RdmaMemory"):
        attach_rdma_memory_hook(None, None)


class _Silent(TransportEndpoint):
    """An endpoint of a spec-1.0 provider: transfers only, no signals."""

    def bind(self) -> bytes:
        return b"silent"

    def connect(self, peer_url: bytes, timeout: timedelta) -> None:
        raise AssertionError("never asked")

    def connected(self) -> bool:
        return False

    def write(self, *args: object) -> None:
        raise AssertionError("never asked")

    read = write

    def close(self) -> None:
        pass


class _SpecOneZero(_Unusable):
    name: ClassVar[str] = "spec-1.0"
    spec_version: ClassVar[str] = "1.0"

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        return True, "ok"

    def endpoint(self, device: torch.device, timeout: timedelta) -> TransportEndpoint:
        return _Silent()


def test_a_transport_without_signals_says_so_and_refuses_them(
    no_installed_transports: None,
) -> None:
    _transport.register_transport("spec-1.0", _SpecOneZero)
    try:
        transport = RdmaTransport(torch.device("cpu"))
        assert transport.supports_signals() is False
        assert transport.max_post_bytes() == 0
        for call in (transport.signal, transport.signals, transport.flush):
            with pytest.raises(torchcomms.CommStateError, match="does not carry signals"):
                call()
        with pytest.raises(torchcomms.CommStateError, match="does not carry signals"):
            transport.post_write(torch.zeros(1), RdmaRemoteBuffer(0, 4, "k"))
        with pytest.raises(NotImplementedError, match="does not implement signals"):
            _Silent().signal(timedelta(seconds=1))
        with pytest.raises(NotImplementedError, match="does not implement posted writes"):
            _Silent().flush(timedelta(seconds=1))
    finally:
        _transport.unregister_transport("spec-1.0")


# -- the transport registry is the backends' registry: conflicts and load errors ------------

PROVIDER = """
from torchcomms_core.spec.transport import TransportProvider

class Provider(TransportProvider):
    name = "{name}"

    def endpoint(self, device, timeout):
        raise AssertionError("never asked")

    def register(self, tensor):
        raise AssertionError("never asked")
"""


def test_installed_transports_conflicting_or_broken_are_refused_naming_the_fix(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_misbehaving_plugins import fake_dist

    group = _transport.TRANSPORTS_GROUP
    for dist, module in (("tc-wire-a", "tc_wire_a"), ("tc-wire-b", "tc_wire_b")):
        source = PROVIDER.format(name="wire")
        fake_dist(tmp_path / dist, dist, "0.1", group, f"wire = {module}:Provider", module, source)
        monkeypatch.syspath_prepend(str(tmp_path / dist))
    fake_dist(tmp_path / "b", "tc-typo", "0.2", group, "typo = tc_typo:Provider", "tc_typo", "")
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    entries = _transport.transport_entry_points()
    assert entries["wire"].choice == "ambiguous"
    assert {e.distribution for e in (entries["wire"], *entries["wire"].others)} == {
        "tc-wire-a",
        "tc-wire-b",
    }
    with pytest.raises(torchcomms.BackendLoadError, match="registered by tc-wire-"):
        _transport.get_transport_class("wire")
    with pytest.raises(torchcomms.BackendLoadError) as caught:
        _transport.get_transport_class("typo")
    message = str(caught.value)
    assert "transport 'typo' from tc-typo 0.2" in message
    assert "names 'Provider', which module 'tc_typo' does not define" in message
    assert '[project.entry-points."torchcomms.transports"] section' in message
    assert "typo" in torchcomms.available_transports()
    assert not isinstance(caught.value, torchcomms.BackendNotFoundError)

"""The reference's hint keys: gloo ``lazy``/``persistent_store``, the NCCL family's
``is_high_priority_stream``/``max_event_pool_size``/``<prefix>::<ncclConfig field>``, and
one warning for a key the backend does not read."""

from __future__ import annotations

import types
import warnings

import pytest
import torch

import torchcomms
from torchcomms_core.engines import nccl_engine as cuda_support
from torchcomms_core.operations import hints as hint_rules
from torchcomms_core.testing import unique_name
from torchcomms_ncclx import NCCLXBackend
from torchcomms_rccl import RCCLBackend


def test_an_unknown_hint_is_warned_once_naming_the_keys() -> None:
    hint_rules._reset_reported()
    name = unique_name("hints")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = torchcomms.new_comm("fake", "cpu", name=name, hints={"sise": "4"})
        b = torchcomms.new_comm("fake", "cpu", name=name + "b", hints={"sise": "4"})
        b.set_hints({"sise": "4", "size": "2"})
    unknown = [w for w in caught if issubclass(w.category, hint_rules.UnknownHintWarning)]
    assert len(unknown) == 1, [str(w.message) for w in caught]
    message = str(unknown[0].message)
    assert "'sise'" in message and "'fake'" in message and "'rank', 'size'" in message
    assert unknown[0].filename == __file__  # points at the caller's line
    a.finalize()
    b.finalize()


def test_declared_keys_with_a_prefix_pattern() -> None:
    assert hint_rules.key_known("ncclx::cgaClusterSize", ("ncclx::*",))
    assert not hint_rules.key_known("ncclx::", ("ncclx::*",))
    assert not hint_rules.key_known("nccl::x", ("ncclx::*",))
    assert "ncclx::*" in NCCLXBackend.hint_keys
    assert "rccl::*" in RCCLBackend.hint_keys and "rccl.register_memory" in RCCLBackend.hint_keys
    for cls in (NCCLXBackend, RCCLBackend):
        for key in ("is_high_priority_stream", "max_event_pool_size", "persistent_store"):
            assert key in cls.hint_keys


def test_new_comm_sets_the_reference_priority_key() -> None:
    hint_rules._reset_reported()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hint_rules.UnknownHintWarning)
        comm = torchcomms.new_comm(
            "fake", "cpu", name=unique_name("prio"), is_high_priority_stream=True
        )
    assert comm.get_options().hints["is_high_priority_stream"] == "true"
    comm.finalize()


def _options(hints: dict[str, str]) -> torchcomms.CommOptions:
    options = torchcomms.CommOptions()
    options.hints = hints
    return options


@pytest.mark.parametrize(
    ("hints", "match"),
    [
        ({"max_event_pool_size": "0"}, "at least 1"),
        ({"max_event_pool_size": "lots"}, "not an integer"),
        ({"persistent_store": "perhaps"}, "not a boolean"),
        ({"cgaClusterSize": "four"}, "is an integer"),
        ({"ncclx::commDesc": "mine"}, "must not be set"),
        ({"enable_cuda_graph_support": "often"}, "not a boolean"),
        ({"ncclx.typo": "true"}, "unknown hint"),
    ],
)
def test_nccl_family_hints_are_checked_before_any_gpu_is_touched(hints, match) -> None:
    """The call path of ncclx's init without a GPU: hints are refused first."""
    with pytest.raises(torchcomms.CommInputError, match=match):
        NCCLXBackend().init(torch.device("cuda"), "x", _options(hints))


def test_good_nccl_hints_reach_the_device_check() -> None:
    backend = NCCLXBackend()
    good = {
        "is_high_priority_stream": "true",
        "max_event_pool_size": "64",
        "persistent_store": "true",
        "cgaClusterSize": "2",
    }
    if torch.cuda.is_available():
        pytest.skip("needs a machine without a GPU (scripts/gpu_checks.sh covers GPUs)")
    with pytest.raises(torchcomms.CommInputError, match="no CUDA device|sees no CUDA"):
        backend.init(torch.device("cuda"), "x", _options(good))
    assert backend.max_event_pool_size == 64


def test_nccl_config_fields_map_to_torch_names() -> None:
    """The prefixed scheme rccl keeps (``rccl::<field>``)."""
    settings = cuda_support.nccl_config_hints(
        {
            "rccl::cgaClusterSize": "4",
            "rccl::min_ctas": "2",
            "rccl::netName": "IB",
            "other": "x",
        },
        "rccl",
    )
    assert settings == [
        ("rccl::cgaClusterSize", "cga_cluster_size", 4),
        ("rccl::min_ctas", "min_ctas", 2),
        ("rccl::netName", "net_name", "IB"),
    ]
    config = types.SimpleNamespace(cga_cluster_size=0, min_ctas=0, net_name="")
    cuda_support.apply_nccl_config(config, settings)
    assert (config.cga_cluster_size, config.min_ctas, config.net_name) == (4, 2, "IB")
    with pytest.raises(torchcomms.CommInputError, match="has no 'max_ctas'"):
        cuda_support.apply_nccl_config(types.SimpleNamespace(), [("ncclx::maxCTAs", "max_ctas", 8)])


def body_gloo_lazy(lazy: str) -> tuple[int, float, str | None]:
    import os

    before = os.environ.get("TORCH_GLOO_LAZY_INIT")
    comm = torchcomms.new_comm(
        "gloo", "cpu", name=unique_name("lazy"), hints={"lazy": lazy, "persistent_store": "true"}
    )
    connected = comm.get_backend_impl().connections_at_creation
    t = torch.full((3,), float(comm.get_rank() + 1))
    comm.all_reduce(t, torchcomms.ReduceOp.SUM)
    comm.finalize()
    return connected, float(t[0]), os.environ.get("TORCH_GLOO_LAZY_INIT", before)


@pytest.mark.parametrize("n", [2, 4])
def test_gloo_lazy_connects_on_first_use(n: int) -> None:
    # Fresh rank processes: nothing an earlier test left running there may add a connection.
    # The count is of the engine's own peer connections open when it was built.
    from torchcomms_core.testing import RankPool

    with RankPool(n) as pool:
        for connected, total, variable in pool.run(body_gloo_lazy, "true"):
            assert connected == 0  # nothing connected when new_comm returned
            assert total == n * (n + 1) / 2
            assert variable is None  # the engine's variable is put back as it was
        for connected, total, _ in pool.run(body_gloo_lazy, "false"):
            assert connected == n - 1  # the full mesh, at creation
            assert total == n * (n + 1) / 2


def test_mem_allocator_call_path_without_a_gpu() -> None:
    """torchcomms.get_mem_allocator('ncclx') asks the backend class, not an instance."""
    if torch.cuda.is_available():
        pytest.skip("needs a machine without a GPU")
    for name in ("ncclx", "nccl", "rccl"):
        with pytest.raises(torchcomms.CommInputError, match="allocates CUDA memory"):
            torchcomms.get_mem_allocator(name)
    # With a live communicator whose engine has NCCL's allocator, that one is returned.
    sentinel = object()
    backend = NCCLXBackend()
    backend._engine = types.SimpleNamespace(mem_allocator=sentinel)
    NCCLXBackend._live.add(backend)
    try:
        assert torchcomms.get_mem_allocator("ncclx") is sentinel
        assert backend.get_mem_allocator() is sentinel
    finally:
        NCCLXBackend._live.discard(backend)
    with pytest.raises(torchcomms.BackendLoadError, match="no memory allocator"):
        torchcomms.get_mem_allocator("gloo")


def test_ncclx_hints_follow_the_reference_scheme() -> None:
    """Unprefixed ncclConfig_t fields, ``ncclx::*`` NCCLX hints, the NCCLX keys, and the
    old prefixed form with a deprecation (the parsing, without a GPU)."""
    import warnings

    from torchcomms_ncclx import hints as ncclx_hints

    every_field = {
        "blocking": "0",
        "cgaClusterSize": "4",
        "minCTAs": "1",
        "maxCTAs": "8",
        "netName": "IB",
        "splitShare": "1",
        "trafficClass": "3",
        "commName": "trainer",
        "collnetEnable": "0",
        "CTAPolicy": "1",
        "shrinkShare": "1",
        "nvlsCTAs": "16",
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = ncclx_hints.parse({**every_field, "ncclx::lazySetupChannels": "1", "size": "2"})
    assert [(key, value) for key, _, value in got.config] == [
        (k, v if k in ("netName", "commName") else int(v)) for k, v in every_field.items()
    ]
    attrs = {attr for _, attr, _ in got.config}
    assert {"cga_cluster_size", "comm_name", "shrink_share", "nvls_ctas"} <= attrs
    assert got.ncclx == {"ncclx::lazySetupChannels": "1"}
    aliases = ncclx_hints.parse({"cga_cluster_size": "2", "cta_policy": "1", "nvls_ctas": "4"})
    assert [a for _, a, _ in aliases.config] == ["cga_cluster_size", "cta_policy", "nvls_ctas"]
    with pytest.warns(DeprecationWarning, match="pass 'maxCTAs'"):
        old = ncclx_hints.parse({"ncclx::maxCTAs": "8"})
    assert old.config == [("ncclx::maxCTAs", "max_ctas", 8)] and old.ncclx == {}
    with (
        pytest.raises(torchcomms.CommInputError, match="is an integer"),
        pytest.warns(DeprecationWarning),
    ):
        ncclx_hints.parse({"ncclx::maxCTAs": "many"})
    with pytest.raises(torchcomms.CommInputError, match="names no NCCLX hint"):
        ncclx_hints.parse({"ncclx::": "1"})
    for key in (
        "garbage_collect_interval_ms",
        "enable_cuda_graph_support",
        "graph_timeout_check_interval_ms",
        "commName",
        "ncclx::anything",
    ):
        assert hint_rules.key_known(key, NCCLXBackend.hint_keys or ())

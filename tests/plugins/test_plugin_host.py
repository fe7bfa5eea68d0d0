"""The plugin host: entry-point loading, kill switch, allow-list, conflicts, lifecycle hooks.

Entry-point behaviour runs in fresh interpreters over faked distributions on disk,
so the test process's own plugin state is never disturbed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from memory_backend import MemoryBackend, make_group, run_threads

import torchcomms
from torchcomms import Collective, PluginError, ReduceOp, hookimpl
from torchcomms_core.testing import unique_name

COLLECTIVE_PLUGIN = """
import torch
from torchcomms import Collective, hookimpl

def _double(backend, tensor, async_op, *, timeout=None, hints=None):
    tensor.mul_(2)
    return backend.all_reduce(tensor, __import__("torchcomms").ReduceOp.SUM, async_op,
                              timeout=timeout, hints=hints)

@hookimpl
def torchcomms_register_collectives():
    return [Collective(name="{coll}", impl=_double, args=("tensor",))]
"""


def fake_dist(
    root: Path,
    dist: str,
    version: str,
    module: str,
    source: str,
    group: str = "torchcomms.plugins",
    ep_name: str | None = None,
) -> None:
    """Write an installed-looking distribution (dist-info + module) under ``root``."""
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{ep_name or module} = {module}\n")
    (root / f"{module}.py").write_text(textwrap.dedent(source))


def run_python(code: str, root: Path, **env: str) -> subprocess.CompletedProcess:
    full = {
        **os.environ,
        "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        **env,
    }
    for var in ("TORCHCOMM_PLUGINS", "TORCHCOMM_DISABLE_PLUGIN_AUTOLOAD"):
        if var not in env:
            full.pop(var, None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full,
        timeout=120,
    )


LIST = "import json, torchcomms; print(json.dumps(torchcomms.list_collectives()))"


@pytest.fixture
def plugin_root(tmp_path: Path) -> Path:
    fake_dist(
        tmp_path,
        "tc-doubler",
        "2.0.1",
        "tc_doubler",
        COLLECTIVE_PLUGIN.format(coll="doubled_all_reduce"),
    )
    return tmp_path


def test_entry_point_plugin_adds_a_collective(plugin_root: Path) -> None:
    res = run_python(LIST, plugin_root)
    assert res.returncode == 0, res.stderr
    listing = json.loads(res.stdout)
    assert listing["doubled_all_reduce"] == "tc-doubler 2.0.1"
    assert listing["all_reduce_coalesced"].startswith("torchcomms-core")
    assert listing["all_reduce"] == "torchcomms-core"


def test_kill_switch_disables_entry_point_plugins(plugin_root: Path) -> None:
    res = run_python(LIST, plugin_root, TORCHCOMM_DISABLE_PLUGIN_AUTOLOAD="1")
    listing = json.loads(res.stdout)
    assert "doubled_all_reduce" not in listing
    assert "all_reduce_coalesced" in listing  # built-ins still load


def test_allow_list_loads_only_named_plugins(plugin_root: Path) -> None:
    assert "doubled_all_reduce" not in json.loads(
        run_python(LIST, plugin_root, TORCHCOMM_PLUGINS="something_else").stdout
    )
    assert "doubled_all_reduce" in json.loads(
        run_python(LIST, plugin_root, TORCHCOMM_PLUGINS="tc_doubler").stdout
    )


def test_plugin_that_fails_to_import_is_contained(tmp_path: Path) -> None:
    fake_dist(tmp_path, "tc-broken", "0.3.0", "tc_broken", "raise ImportError('needs libfoo.so')")
    res = run_python(
        """
        import warnings, json, torchcomms
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            listing = torchcomms.list_collectives()
        print(json.dumps([str(w.message) for w in caught]))
        print(torchcomms.get_backend_class("gloo").__name__)
    """,
        tmp_path,
    )
    assert res.returncode == 0, res.stderr
    warned, backend = res.stdout.strip().splitlines()
    message = json.loads(warned)[0]
    assert "tc-broken 0.3.0" in message and "needs libfoo.so" in message
    assert backend == "GlooBackend"


def test_an_entry_point_naming_the_hook_function_is_refused_with_the_fix(tmp_path: Path) -> None:
    # A common slip: the entry point names the hook function, not the module holding it.
    # pluggy would register the function and find no hook on it: the collective would be
    # silently missing. The plugin host's registry refuses it, saying what to write.
    fake_dist(tmp_path, "tc-fn", "1.2", "tc_fn", COLLECTIVE_PLUGIN.format(coll="fn_reduce"))
    info = tmp_path / "tc_fn-1.2.dist-info" / "entry_points.txt"
    info.write_text("[torchcomms.plugins]\ntc_fn = tc_fn:torchcomms_register_collectives\n")
    res = run_python(
        """
        import warnings, json, torchcomms
        from torchcomms_core.plugin_host.manager import plugin_records
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            listing = torchcomms.list_collectives()
        records = {r.name: [r.status, r.error] for r in plugin_records()}
        print(json.dumps([[str(w.message) for w in caught], records, listing]))
    """,
        tmp_path,
    )
    assert res.returncode == 0, res.stderr
    warned, records, listing = json.loads(res.stdout)
    status, error = records["tc_fn"]
    assert status == "failed"
    assert "tc-fn 1.2" in error and "registers no hook" in error
    assert "must name the module" in error
    assert any("registers no hook" in w for w in warned), warned
    assert "fn_reduce" not in listing
    assert "all_reduce_coalesced" in listing  # the built-in plugin still loads


def test_two_plugins_with_one_collective_name_name_both_distributions(tmp_path: Path) -> None:
    fake_dist(tmp_path, "tc-alpha", "1.0", "tc_alpha", COLLECTIVE_PLUGIN.format(coll="same"))
    fake_dist(tmp_path, "tc-beta", "2.0", "tc_beta", COLLECTIVE_PLUGIN.format(coll="same"))
    res = run_python(LIST, tmp_path)
    assert res.returncode != 0
    assert "PluginError" in res.stderr
    assert "tc-alpha 1.0" in res.stderr and "tc-beta 2.0" in res.stderr


def test_misspelled_hook_is_caught(tmp_path: Path) -> None:
    fake_dist(
        tmp_path,
        "tc-typo",
        "1.0",
        "tc_typo",
        """
        from torchcomms import hookimpl
        @hookimpl
        def torchcomms_comm_craeted(comm):
            pass
    """,
    )
    res = run_python(LIST, tmp_path)
    assert res.returncode != 0
    assert "torchcomms_comm_craeted" in res.stderr and "unknown hook" in res.stderr


def test_cli_lists_backends_and_plugins(plugin_root: Path) -> None:
    res = run_python(
        "from torchcomms_core.cli import main; main(['backends', '--json'])", plugin_root
    )
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert rows["gloo"]["distribution"] == "torchcomms-gloo" and rows["gloo"]["runnable"]
    assert rows["gloo"]["spec_version"] == torchcomms.SPEC_VERSION
    assert "all_gather_v" in rows["gloo"]["derived"]
    res = run_python("from torchcomms_core.cli import main; main(['plugins'])", plugin_root)
    assert "tc_doubler" in res.stdout and "doubled_all_reduce" in res.stdout
    assert "loaded" in res.stdout


# -- in-process registration -----------------------------------------------------------


class Lifecycle:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    @hookimpl
    def torchcomms_comm_finalized(self, comm) -> None:
        self.events.append(("finalized", comm.get_name()))

    @hookimpl
    def torchcomms_comm_aborted(self, comm, reason) -> None:
        self.events.append(("aborted", reason))


def test_lifecycle_hooks_observe_finalize_and_abort() -> None:
    observer = Lifecycle()
    torchcomms.register_plugin(observer, name="lifecycle-test")
    try:
        (a,) = make_group(1, name="life-a")
        (b,) = make_group(1, name="life-b")
        a.finalize()
        b.abort()
    finally:
        torchcomms.unregister_plugin("lifecycle-test")
    assert observer.events == [("finalized", "life-a"), ("aborted", "abort")]


class Scaler:
    @hookimpl
    def torchcomms_register_collectives(self):
        def scaled(backend, tensor, factor, async_op, *, timeout=None, hints=None):
            tensor.mul_(factor)
            return backend.all_reduce(tensor, ReduceOp.SUM, async_op, timeout=timeout, hints=hints)

        return [
            Collective(
                name="scaled_sum", impl=scaled, args=("tensor", "factor"), defaults={"factor": 1.0}
            )
        ]


class NativeScaled(MemoryBackend):
    calls = 0

    def scaled_sum(self, tensor, factor, async_op, *, timeout=None, hints=None):
        NativeScaled.calls += 1
        tensor.fill_(-1)
        return None


def test_plugin_collective_is_a_method_with_hooks_and_native_override() -> None:
    torchcomms.register_plugin(Scaler(), name="scaler", provider="tc-scaler 1.0")
    try:
        assert torchcomms.list_collectives()["scaled_sum"] == "tc-scaler 1.0"
        comms = make_group(2, name="scaled")
        seen = []
        comms[0].register_pre_hook(lambda name, op_id, args: seen.append((name, args.factor)))

        def body(comm):
            t = torch.ones(3)
            comm.scaled_sum(t, 3.0)
            u = torch.ones(1)
            w = comm.scaled_sum(u, 2.0, True)  # async_op positionally
            w.wait()
            v = torch.ones(1)
            comm.scaled_sum(v)  # default factor
            return t[0].item(), u.item(), v.item()

        assert run_threads(comms, body) == [(6.0, 4.0, 2.0)] * 2
        assert seen == [("scaled_sum", 3.0), ("scaled_sum", 2.0), ("scaled_sum", 1.0)]
        with pytest.raises(torchcomms.CommTypeError, match="missing required arguments: tensor"):
            comms[0].scaled_sum()
        # A backend with a native method of the same name gets the call.
        (native,) = _native_group()
        t = torch.ones(2)
        native.scaled_sum(t, 5.0)
        assert NativeScaled.calls == 1 and t.tolist() == [-1.0, -1.0]
        with pytest.raises(
            PluginError, match="registered twice: by tc-scaler 1.0 and by tc-other 9"
        ):
            torchcomms.register_plugin(Scaler(), name="scaler2", provider="tc-other 9")
    finally:
        torchcomms.unregister_plugin("scaler")
        torchcomms.unregister_plugin("scaler2")
    assert "scaled_sum" not in torchcomms.list_collectives()
    with pytest.raises(AttributeError, match="no attribute 'scaled_sum'"):
        _ = comms[0].scaled_sum


def _native_group():
    from datetime import timedelta

    from memory_backend import _Fabric
    from torch.distributed import HashStore

    from torchcomms import CommOptions
    from torchcomms_core.comm.operations import TorchComm

    backend = NativeScaled(_Fabric(1), 0)
    opts = CommOptions(
        timeout=timedelta(seconds=5),
        store=HashStore(),
        name="native",
        rank=0,
        abort_process_on_timeout_or_error=False,
        size=1,
    )
    backend._bind(torch.device("cpu"), "native", opts)
    return [TorchComm(backend, torch.device("cpu"), "native", opts, opts.store)]


def body_coalesced() -> list[float]:
    comm = torchcomms.new_comm("gloo", "cpu", name=unique_name("coalesced"))
    r = comm.get_rank()
    tensors = [torch.full((3,), float(r)), torch.full((2, 2), float(r + 1))]
    comm.all_reduce_coalesced(tensors, ReduceOp.SUM)
    comm.finalize()
    return [tensors[0][0].item(), tensors[1][1, 1].item()]


def test_builtin_coalesced_all_reduce_over_gloo(pool2) -> None:
    assert pool2.run(body_coalesced) == [[1.0, 3.0], [1.0, 3.0]]

"""Plugins and backends that misbehave: a raising registration hook, two owners of one name.

Installed distributions are faked on disk (dist-info + module) and put on the rank
processes' ``sys.path``; every scenario ends with a real communicator over gloo.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import torchcomms
from torchcomms_core.testing import RankPool, unique_name


def fake_dist(
    root: Path, dist: str, version: str, group: str, entry: str, module: str, source: str
) -> None:
    """Write an installed-looking distribution with one entry point under ``root``."""
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entry}\n")
    (root / f"{module}.py").write_text(textwrap.dedent(source))


def _all_reduce(comm) -> float:
    t = torch.ones(1)
    comm.all_reduce(t, torchcomms.ReduceOp.SUM)
    return t.item()


def _cli(*args: str) -> str:
    from torchcomms_core.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(list(args))
    return out.getvalue()


# -- a plugin whose registration hook raises (item: contained like a failed import) ------

RAISING_PLUGIN = """
import torchcomms
from torchcomms import Collective, hookimpl

def _noop(backend, tensor, async_op, *, timeout=None, hints=None):
    return None

@hookimpl
def torchcomms_register_collectives():
    yield Collective(name="half_installed", impl=_noop, args=("tensor",))
    raise RuntimeError("cannot find libfancy.so")
"""

HEALTHY_PLUGIN = """
import torchcomms
from torchcomms import Collective, ReduceOp, hookimpl

def _doubled(backend, tensor, async_op, *, timeout=None, hints=None):
    tensor.mul_(2)
    return backend.all_reduce(tensor, ReduceOp.SUM, async_op, timeout=timeout, hints=hints)

@hookimpl
def torchcomms_register_collectives():
    return [Collective(name="doubled_sum", impl=_doubled, args=("tensor",))]
"""


def body_raising_hook(root: str) -> dict:
    sys.path.insert(0, root)
    importlib.invalidate_caches()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = torchcomms.new_comm("gloo", "cpu", name=unique_name("hook"))
    second = torchcomms.new_comm("gloo", "cpu", name=unique_name("hook"))
    t = torch.ones(1)
    second.doubled_sum(t)  # the healthy plugin still works
    from torchcomms_core.plugin_host.manager import plugin_records

    records = {r.name: [r.distribution, r.version, r.status, r.error] for r in plugin_records()}
    out = {
        "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
        "sums": [_all_reduce(first), _all_reduce(second)],
        "doubled": t.item(),
        "half_installed": hasattr(first, "half_installed")
        or "half_installed" in torchcomms.list_collectives(),
        "records": records,
        "cli_json": json.loads(_cli("plugins", "--json"))["plugins"],
        "cli_text": _cli("plugins"),
    }
    first.finalize()
    second.finalize()
    return out


def test_a_plugin_whose_registration_hook_raises_is_contained(tmp_path: Path) -> None:
    fake_dist(
        tmp_path,
        "tc-fancy",
        "1.4.2",
        "torchcomms.plugins",
        "tc_fancy = tc_fancy",
        "tc_fancy",
        RAISING_PLUGIN,
    )
    fake_dist(
        tmp_path,
        "tc-doubler",
        "0.9",
        "torchcomms.plugins",
        "tc_doubler = tc_doubler",
        "tc_doubler",
        HEALTHY_PLUGIN,
    )
    # Plugins load once per process: these ranks are fresh, unlike the shared pools.
    with RankPool(2, comm_timeout_s=30) as fresh:
        results = fresh.run(body_raising_hook, str(tmp_path), timeout=120)
    for out in results:
        (warning,) = [w for w in out["warnings"] if "tc_fancy" in w]
        assert "tc-fancy 1.4.2" in warning and "cannot find libfancy.so" in warning
        assert "failed to register" in warning and "TORCHCOMM_PLUGINS" in warning
        assert out["sums"] == [2.0, 2.0]
        assert out["doubled"] == 4.0
        assert not out["half_installed"]  # nothing of the failed plugin stays installed
        dist, version, status, error = out["records"]["tc_fancy"]
        assert (dist, version, status) == ("tc-fancy", "1.4.2", "failed")
        assert "cannot find libfancy.so" in error
        assert out["records"]["tc_doubler"][2] == "loaded"
        cli = {p["name"]: p for p in out["cli_json"]}
        assert cli["tc_fancy"]["status"] == "failed"
        line = next(ln for ln in out["cli_text"].splitlines() if ln.startswith("tc_fancy"))
        assert "tc-fancy" in line and "1.4.2" in line and "failed" in line


# -- two distributions registering one backend name -------------------------------------

IMPOSTOR = '''
from torchcomms_gloo import GlooBackend

class {cls}(GlooBackend):
    """Works like gloo, under another distribution's name."""
'''


@contextlib.contextmanager
def _installed(root: str, env: dict[str, str], names: tuple[str, ...]):
    """Put fake distributions on the path and forget cached backend classes, then undo it."""
    from torchcomms_core.plugin_host import backends as registry

    saved = {n: registry._loaded.pop(n) for n in names if n in registry._loaded}
    sys.path.insert(0, root)
    importlib.invalidate_caches()
    os.environ.update(env)
    try:
        yield
    finally:
        for key in env:
            os.environ.pop(key, None)
        sys.path.remove(root)
        importlib.invalidate_caches()
        for n in names:
            registry._loaded.pop(n, None)
        registry._loaded.update(saved)


def body_backend_conflict(root: str, env: dict[str, str], name: str) -> dict:
    out: dict = {}
    with _installed(root, env, (name,)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                comm = torchcomms.new_comm(name, "cpu", name=unique_name("dup"))
            except torchcomms.TorchCommError as exc:
                out["error"] = (type(exc).__name__, str(exc))
                comm = None
        out["warnings"] = [str(w.message) for w in caught if "registered by" in str(w.message)]
        out["cli_json"] = {r["name"]: r for r in json.loads(_cli("backends", "--json"))}
        out["cli_text"] = _cli("backends")
    if comm is not None:
        out["class"] = type(comm.get_backend_impl()).__name__
        out["sum"] = _all_reduce(comm)
        comm.finalize()
    # Whatever happened, the real gloo still runs.
    plain = torchcomms.new_comm("gloo", "cpu", name=unique_name("plain"))
    out["plain"] = (type(plain.get_backend_impl()).__name__, _all_reduce(plain))
    plain.finalize()
    return out


@pytest.fixture
def impostors(tmp_path: Path) -> Path:
    fake_dist(
        tmp_path,
        "evil-gloo",
        "6.6.6",
        "torchcomms.backends",
        "gloo = evil_gloo:ImpostorGloo",
        "evil_gloo",
        IMPOSTOR.format(cls="ImpostorGloo"),
    )
    for dist, cls in (("tc-alpha", "AlphaBackend"), ("tc-beta", "BetaBackend")):
        module = dist.replace("-", "_")
        fake_dist(
            tmp_path,
            dist,
            "1.0",
            "torchcomms.backends",
            f"tcdup = {module}:{cls}",
            module,
            IMPOSTOR.format(cls=cls),
        )
    return tmp_path


def test_a_package_registering_gloo_does_not_take_it_over(pool2, impostors: Path) -> None:
    for out in pool2.run(body_backend_conflict, str(impostors), {}, "gloo", timeout=60):
        assert "error" not in out, out
        assert out["class"] == "GlooBackend" and out["sum"] == 2.0
        (warning,) = out["warnings"]
        assert "torchcomms-gloo" in warning and "evil-gloo 6.6.6" in warning
        assert "TORCHCOMM_BACKEND_OVERRIDE=gloo=<distribution>" in warning
        row = out["cli_json"]["gloo"]
        assert row["distribution"] == "torchcomms-gloo"
        assert row["also_registered_by"] == ["evil-gloo 6.6.6"]
        assert "conflict: also evil-gloo 6.6.6" in out["cli_text"]


def test_the_override_variable_hands_a_builtin_name_to_another_package(
    pool2, impostors: Path
) -> None:
    env = {"TORCHCOMM_BACKEND_OVERRIDE": "gloo=evil-gloo"}
    for out in pool2.run(body_backend_conflict, str(impostors), env, "gloo", timeout=60):
        assert out["class"] == "ImpostorGloo" and out["sum"] == 2.0
        assert out["plain"] == ("GlooBackend", 2.0)  # the override ended with the variable
        row = out["cli_json"]["gloo"]
        assert row["distribution"] == "evil-gloo"
        assert "chosen by TORCHCOMM_BACKEND_OVERRIDE" in row["conflict"]


def test_two_packages_sharing_a_new_name_are_refused_until_one_is_chosen(
    pool2, impostors: Path
) -> None:
    for out in pool2.run(body_backend_conflict, str(impostors), {}, "tcdup", timeout=60):
        kind, message = out["error"]
        assert kind == "BackendLoadError"
        assert "tc-alpha 1.0 and tc-beta 1.0" in message
        assert "TORCHCOMM_BACKEND_OVERRIDE=tcdup=" in message
        assert out["plain"] == ("GlooBackend", 2.0)
        assert "tc-beta 1.0" in out["cli_json"]["tcdup"]["conflict"]
    env = {"TORCHCOMM_BACKEND_OVERRIDE": "tcdup=tc-beta"}
    for out in pool2.run(body_backend_conflict, str(impostors), env, "tcdup", timeout=60):
        assert out["class"] == "BetaBackend" and out["sum"] == 2.0


def test_a_malformed_override_is_explained(monkeypatch, capsys) -> None:
    from torchcomms_core.cli import main

    monkeypatch.setenv("TORCHCOMM_BACKEND_OVERRIDE", "gloo")
    with pytest.raises(SystemExit) as exit_info:
        main(["backends"])
    assert exit_info.value.code == 2
    assert "'gloo' is not name=distribution; write e.g. TORCHCOMM_BACKEND_OVERRIDE=gloo=" in (
        capsys.readouterr().err
    )
    with pytest.raises(torchcomms.BackendLoadError, match="is not name=distribution"):
        torchcomms.new_comm("no-such-backend", "cpu", name="never-created")

"""The PyTorch releases the bridge supports, and what each one changes (#55, #59).

torch 2.13 and 2.14 are supported as equals (``torchcomms_core.foundation.torch_compat``
says what differs). These tests run real rank processes of unchanged scripts on whichever
release is installed and assert what a user observes there: a backend found by name, the
identity c10d reports for its groups, c10d's lists before a backend is used, and a clear
refusal on a release the bridge does not know.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from torchcomms_core.foundation import torch_compat

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_c10d_backend_names import (  # noqa: E402
    SCRIPT,
    _clean_env,
    check_against_gloo,
    launch,
    results,
)

# torch's own names, as a process without torchcomms installed has them.
TORCH_OWN = {"undefined", "gloo", "nccl", "xccl", "ucc", "mpi", "fake"}


def test_the_release_in_use_is_a_tested_one() -> None:
    assert torch_compat.RELEASE in torch_compat.TESTED, torch.__version__
    assert torch_compat.untested_reason() == ""
    torch_compat.check_tested()


@pytest.mark.parametrize(
    ("version", "release"),
    [("2.13.0+cpu", (2, 13)), ("2.14.1+cu130", (2, 14)), ("2.15.0a0+git1234", (2, 15))],
)
def test_release_parsing(version: str, release: tuple[int, int]) -> None:
    assert torch_compat.parse_release(version) == release


def test_release_parsing_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="not a PyTorch version"):
        torch_compat.parse_release("nightly")


@pytest.mark.parametrize("version", ["2.12.0", "2.15.0", "3.0.0"])
def test_an_untested_release_is_named_with_the_way_out(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(torch_compat.ALLOW_UNTESTED, raising=False)
    with pytest.raises(torch_compat.UntestedTorchError) as info:
        torch_compat.check_tested(version)
    message = str(info.value)
    assert f"torch {version}" in message
    assert "2.13 and 2.14" in message
    assert torch_compat.ALLOW_UNTESTED in message
    monkeypatch.setenv(torch_compat.ALLOW_UNTESTED, "1")
    torch_compat.check_tested(version)


def test_the_differences_follow_the_release() -> None:
    newer = torch_compat.RELEASE >= (2, 14)
    assert torch_compat.C10D_BACKEND_ENTRY_POINTS == newer
    assert torch_compat.SWITCH_ASKS_BACKEND_BUILT == newer
    assert torch_compat.PYTHON_C10D_BACKEND == newer
    assert torch_compat.COMPILE_KEEPS_COLLECTIVE_ORDER == (not newer)
    # What each flag stands for is what the torch in use does.
    from torch.distributed import distributed_c10d as c10d

    assert hasattr(c10d.Backend, "_ensure_backend_registered") == newer
    assert hasattr(c10d, "_torchcomms_handles_backend") == newer


# A script run on a release the bridge does not know (the version is faked after import).
_UNTESTED = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    torch.__version__ = "2.16.0"
    dist.config.use_torchcomms = sys.argv[1] == "1"
    try:
        dist.init_process_group("shm", rank=0, world_size=1, store=dist.HashStore())
    except Exception as exc:
        print("REFUSED", type(exc).__name__, exc)
    else:
        t = torch.ones(2)
        dist.all_reduce(t)
        print("RAN", dist.group.WORLD.get_comm().get_backend(), t.tolist())
        dist.destroy_process_group()
    """
)


@pytest.mark.parametrize("switch", [False, True], ids=["plain", "switch"])
@pytest.mark.parametrize("allow", [False, True], ids=["refused", "allowed"])
def test_an_untested_release_is_refused_before_c10d(switch: bool, allow: bool) -> None:
    env = _clean_env()
    if allow:
        env[torch_compat.ALLOW_UNTESTED] = "1"
    res = subprocess.run(
        [sys.executable, "-c", _UNTESTED, "1" if switch else "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd="/",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    line = res.stdout.strip().splitlines()[-1]
    if allow:
        assert line == "RAN shm [1.0, 1.0]"
    else:
        assert line.startswith("REFUSED UntestedTorchError torch 2.16.0 is not a release"), line
        assert "TORCHCOMM_ALLOW_UNTESTED_TORCH=1" in line


_LISTS = textwrap.dedent(
    """
    import json, torch.distributed as dist
    B = dist.Backend
    print(json.dumps({
        "backend_list": B.backend_list,
        "plugins": sorted(B._plugins),
        "capability": sorted(B.backend_capability),
        "type_map": sorted(B.backend_type_map),
    }))
    """
)


def _lists(env: dict[str, str]) -> dict[str, Any]:
    res = subprocess.run(
        [sys.executable, "-c", _LISTS], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


@pytest.mark.skipif(
    not torch_compat.C10D_BACKEND_ENTRY_POINTS,
    reason="torch 2.13 has no torch.distributed.backends entry points: its autoload "
    "registers every installed backend at import torch (test_c10d_backend_names)",
)
def test_installed_and_unused_leaves_c10d_as_torch_alone() -> None:
    # With the autoload opted out, nothing of ours runs at import torch: that is torch alone.
    env = _clean_env()
    alone = _lists({**env, "TORCHCOMM_C10D_AUTOLOAD": "0"})
    assert set(alone["backend_list"]) == TORCH_OWN
    # Installed, autoload on: the same lists.
    assert _lists(env) == alone


@pytest.mark.skipif(
    not torch_compat.C10D_BACKEND_ENTRY_POINTS,
    reason="torch 2.13 finds backends only through the autoload at import torch",
)
@pytest.mark.parametrize("switch", [False, True], ids=["plain", "switch"])
def test_entry_point_alone_finds_shm_by_name(switch: bool) -> None:
    # The script never imports torchcomms and the autoload is off: c10d resolves "shm" from
    # the torch.distributed.backends entry point of torchcomms-shm.
    got = results(
        launch([str(SCRIPT), "shm"], 2, switch=switch, extra={"TORCHCOMM_C10D_AUTOLOAD": "0"})
    )
    check_against_gloo(got, 2, "shm")


def test_every_backend_distribution_publishes_its_names_to_torch() -> None:
    from importlib import metadata

    published = {
        ep.name: ep.value
        for ep in metadata.entry_points(group="torch.distributed.backends")
        if ep.value.startswith("torchcomms_core.")
    }
    ours = {ep.name for ep in metadata.entry_points(group="torchcomms.backends")}
    owned = {"gloo", "nccl", "mpi", "ucc", "xccl", "fake"}
    # Every installed torchcomms backend whose name c10d does not own.
    assert set(published) == {n for n in ours if n not in owned}, published
    for name, value in published.items():
        assert value == f"torchcomms_core.c10d.registrars:{name}"


def test_a_registrar_refuses_a_name_c10d_owns() -> None:
    from torchcomms_core.c10d import registrars
    from torchcomms_core.foundation.errors import BackendNotFoundError

    with pytest.raises(BackendNotFoundError, match="c10d owns the name"):
        registrars.gloo()


def test_autoload_keeps_to_the_names_listed() -> None:
    code = (
        "import torch.distributed as dist\n"
        "print('SHM' in dist.Backend._plugins, 'HIER' in dist.Backend._plugins)\n"
    )
    env = {**_clean_env(), "TORCHCOMM_C10D_AUTOLOAD": "shm"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    # 2.13 registers the listed name at import torch; 2.14 registers none until used.
    at_import = not torch_compat.C10D_BACKEND_ENTRY_POINTS
    assert res.stdout.split() == [str(at_import), "False"]

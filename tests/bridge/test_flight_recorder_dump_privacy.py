"""Flight-recorder dumps other users could reach: they must be private (0600, a per-user
folder) and never written through a planted symlink.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import torch

import torchcomms
from torchcomms_core.testing import unique_name

PRECIOUS = "a file the dump must never overwrite\n"


def _all_reduce(comm) -> float:
    t = torch.ones(1)
    comm.all_reduce(t, torchcomms.ReduceOp.SUM)
    return t.item()


# -- flight-recorder dumps ---------------------------------------------------------------


def body_dump_next_to_planted_symlinks(shared: str, cache: str, victim: str) -> dict:
    from torchcomms.hooks import FlightRecorderHook

    keys = ("XDG_CACHE_HOME", "TORCHCOMM_FR_DUMP_TEMP_FILE")
    saved = {k: os.environ.pop(k, None) for k in keys}
    try:
        comm = torchcomms.new_comm("gloo", "cpu", name=unique_name("frsafe"))
        recorder = FlightRecorderHook(16, isolated=True).register_with_comm(comm)
        _all_reduce(comm)
        rank = comm.get_rank()
        # A prefix in a folder others can write, where they planted the final name and a
        # predictable temporary name as symlinks to a file of ours.
        os.environ["TORCHCOMM_FR_DUMP_TEMP_FILE"] = os.path.join(shared, "trace_")
        final = os.path.join(shared, f"trace_{rank}")
        os.symlink(victim, final)
        os.symlink(victim, f"{final}.tmp{os.getpid()}")
        path = recorder.dump()
        with open(path) as f:
            entries = json.load(f)["entries"]
        # Unset, dumps go to this user's cache folder.
        del os.environ["TORCHCOMM_FR_DUMP_TEMP_FILE"]
        os.environ["XDG_CACHE_HOME"] = cache
        default = recorder.dump()
        recorder.unregister()
        comm.finalize()
        return {
            "path": path,
            "final": final,
            "is_link": os.path.islink(final),
            "mode": stat.S_IMODE(os.lstat(final).st_mode),
            "ops": [e["profiling_name"] for e in entries],
            "default": default,
            "default_mode": stat.S_IMODE(os.stat(default).st_mode),
            "default_dir_mode": stat.S_IMODE(os.stat(os.path.dirname(default)).st_mode),
            "leftovers": sorted(
                n
                for n in os.listdir(shared)
                if ".tmp" in n and not os.path.islink(os.path.join(shared, n))
            ),
        }
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def test_dumps_are_private_and_never_follow_a_planted_symlink(pool2, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text(PRECIOUS)
    shared = tmp_path / "shared"
    shared.mkdir()
    cache = tmp_path / "cache"
    for r, out in enumerate(
        pool2.run(
            body_dump_next_to_planted_symlinks, str(shared), str(cache), str(victim), timeout=60
        )
    ):
        assert out["path"] == out["final"]
        assert not out["is_link"] and out["mode"] == 0o600
        assert out["ops"] == ["gloo:all_reduce"]
        assert out["leftovers"] == []
        assert out["default"] == str(cache / "torch" / f"comm_lib_trace_rank_{r}")
        assert out["default_mode"] == 0o600 and out["default_dir_mode"] == 0o700
    assert victim.read_text() == PRECIOUS


def test_default_dump_folder_belongs_to_the_user(monkeypatch, tmp_path: Path) -> None:
    from torchcomms_core.foundation import env as _env

    monkeypatch.delenv("TORCHCOMM_FR_DUMP_TEMP_FILE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _env.fr_dump_prefix() == str(tmp_path / ".cache" / "torch" / "comm_lib_trace_rank_")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _env.fr_dump_prefix() == str(tmp_path / "xdg" / "torch" / "comm_lib_trace_rank_")

"""Installed torchcomms backends are torch.distributed backends by name (#47).

Every test launches real rank processes (2 and 4) of an unchanged script that never
imports torchcomms, with the switch off and on, and compares what it computes on shm and
hier with plain gloo. Fabric and Accelerate run their DDP steps with ``"shm"`` given as
their backend string.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from torchcomms_core.foundation import torch_compat

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "c10d_names_script.py"
TIMEOUT = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _clean_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHCOMM_", "MASTER_", "TORCHELASTIC_", "TORCH_DISTRIBUTED_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    }
    env["OMP_NUM_THREADS"] = "1"
    return env


def launch(
    args: list[str],
    world: int,
    *,
    switch: bool,
    per_rank: dict[int, dict[str, str]] | None = None,
    extra: dict[str, str] | None = None,
    python: str = sys.executable,
) -> list[subprocess.CompletedProcess[str]]:
    """Run ``python args...`` as ``world`` ranks, with the launcher variables torchrun sets."""
    port = _free_port()
    procs = []
    for rank in range(world):
        env = _clean_env()
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        if switch:
            env["TORCH_DISTRIBUTED_USE_TORCHCOMMS"] = "1"
        env.update(extra or {})
        env.update((per_rank or {}).get(rank, {}))
        procs.append(
            subprocess.Popen(
                [python, *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd="/",
            )
        )
    done = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=TIMEOUT)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return done


def results(runs: list[subprocess.CompletedProcess[str]]) -> list[dict[str, Any]]:
    out = []
    for rank, run in enumerate(runs):
        assert run.returncode == 0, f"rank {rank} failed:\n{run.stderr[-4000:]}"
        line = next((ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")), None)
        assert line is not None, f"rank {rank} printed no result:\n{run.stdout}\n{run.stderr}"
        out.append(json.loads(line[len("RESULT ") :]))
    return out


def _close(a: Any, b: Any, key: str) -> None:
    if isinstance(a, list):
        assert len(a) == len(b), key
        for x, y in zip(a, b, strict=True):
            _close(x, y, key)
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6), f"{key}: {a} != {b}"
    else:
        assert a == b, f"{key}: {a!r} != {b!r}"


_REFERENCE: dict[int, list[dict[str, Any]]] = {}


def gloo_reference(world: int) -> list[dict[str, Any]]:
    if world not in _REFERENCE:
        _REFERENCE[world] = results(launch([str(SCRIPT), "gloo"], world, switch=False))
    return _REFERENCE[world]


def check_against_gloo(got: list[dict[str, Any]], world: int, backend: str) -> None:
    ref = gloo_reference(world)
    own = backend.split(":")[-1]
    for mine, theirs in zip(got, ref, strict=True):
        assert mine["backend"] == backend
        assert mine["group_type"] == "_BackendWrapper"
        # One identity, switch off or on (#59): c10d calls a registered backend's group
        # "custom"; get_backend gives the string the group was made with; the communicator
        # gives our own name. Plain gloo names itself.
        assert mine["identity"] == ["custom", "custom", backend, own]
        assert theirs["identity"] == ["gloo", "gloo", "gloo", None]
        for key, value in theirs.items():
            if key in ("backend", "group_type", "identity"):
                continue
            _close(mine[key], value, key)


HIER_HOSTS = {0: "a", 1: "a", 2: "b", 3: "b"}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("switch", [False, True], ids=["plain", "switch"])
@pytest.mark.parametrize("backend", ["shm", "cpu:shm", "hier"])
def test_unchanged_script_by_name_matches_gloo(backend: str, switch: bool, world: int) -> None:
    per_rank = None
    if backend == "hier":
        # Two hosts by TORCHCOMM_HOST_ID (one rank each at world size 2).
        per_rank = {
            r: {"TORCHCOMM_HOST_ID": HIER_HOSTS[r] if world == 4 else "ab"[r]} for r in range(world)
        }
    got = results(launch([str(SCRIPT), backend], world, switch=switch, per_rank=per_rank))
    check_against_gloo(got, world, backend.split(":")[-1] if ":" not in backend else backend)


def test_backend_normalises_any_name_as_c10d_does() -> None:
    # c10d's Backend(name) must keep passing names it does not know through: get_backend()
    # runs it on whatever name a group was registered under (the reference registers
    # "torchcomm" groups).
    code = "import torch.distributed as dist; print(dist.Backend('TorchComm'), dist.Backend('SHM'))"
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_clean_env(), timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["torchcomm", "shm"]


# What a process sees of our names before it uses one: torch 2.13 learns them at
# ``import torch`` (the autoload); 2.14 finds them when a group first names one (the
# ``torch.distributed.backends`` entry points), so c10d's lists start as torch's own.
_REGISTERED_AT_IMPORT = not torch_compat.C10D_BACKEND_ENTRY_POINTS

_USE_SHM_ONCE = (
    "dist.init_process_group('shm', rank=0, world_size=1, store=dist.HashStore())\n"
    "dist.destroy_process_group()\n"
)


def test_c10d_names_keep_their_meaning_without_the_switch() -> None:
    code = (
        "import torch.distributed as dist\n"
        "B = dist.Backend\n"
        "print('SHM' in B._plugins, 'shm' in B.backend_list)\n"
        + _USE_SHM_ONCE
        + "print(sorted(n for n in B._plugins))\n"
        "print(B.backend_capability['shm'], B.backend_capability['gloo'])\n"
        "print(B.default_device_backend_map['cpu'])\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_clean_env(), timeout=120
    )
    assert res.returncode == 0, res.stderr
    before, plugins, caps, default = res.stdout.splitlines()
    assert before == f"{_REGISTERED_AT_IMPORT} {_REGISTERED_AT_IMPORT}"
    names = eval(plugins)  # a printed list of strings
    assert "SHM" in names
    assert ("HIER" in names) == _REGISTERED_AT_IMPORT  # 2.14: only the name used
    assert not {"GLOO", "NCCL", "MPI", "UCC", "FAKE"} & set(names)
    assert caps == "['cpu'] ['cpu', 'cuda']"
    assert default == "gloo"


def test_autoload_opt_out() -> None:
    code = textwrap.dedent(
        """
        import torch.distributed as dist
        print("SHM" in dist.Backend._plugins)
        import torchcomms
        print(torchcomms.register_c10d_backends().count("shm"), "SHM" in dist.Backend._plugins)
        """
    )
    env = _clean_env()
    env["TORCHCOMM_C10D_AUTOLOAD"] = "0"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "1", "True"]


def test_torchcomms_imported_before_torch_still_registers() -> None:
    code = (
        "import torchcomms, torch.distributed as dist\n"
        "print('SHM' in dist.Backend._plugins)\n"
        + _USE_SHM_ONCE
        + "print('SHM' in dist.Backend._plugins)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_clean_env(), timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [str(_REGISTERED_AT_IMPORT), "True"]


_PG_OPTIONS = textwrap.dedent(
    """
    import datetime, json, torch, torch.distributed as dist
    dist.init_process_group("shm", timeout=datetime.timedelta(seconds=77))
    out = {"timeout": dist.group.WORLD.get_comm().get_timeout().total_seconds()}
    g = dist.new_group([0, 1], pg_options={"arena_bytes": "65536"})
    t = torch.ones(100000) * (dist.get_rank() + 1)
    dist.all_reduce(t, group=g)
    out["sum"] = t[0].item()
    out["hint"] = g.get_comm().get_options().hints.get("arena_bytes")
    from torch.distributed import ProcessGroupGloo
    gloo_options = ProcessGroupGloo._Options()
    gloo_options._timeout = datetime.timedelta(seconds=33)
    # As in c10d, the timeout argument (not the options' _timeout) is the group's.
    h = dist.new_group([0, 1], pg_options=gloo_options, timeout=datetime.timedelta(seconds=33))
    out["gloo_options_timeout"] = h.get_comm().get_timeout().total_seconds()
    try:
        dist.new_group([0, 1], pg_options=object())
    except TypeError as exc:
        out["refused"] = str(exc)
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()
    """
)


@pytest.mark.parametrize("switch", [False, True], ids=["plain", "switch"])
def test_timeout_and_pg_options_reach_the_communicator(switch: bool, tmp_path: Path) -> None:
    script = tmp_path / "pg_options.py"
    script.write_text(_PG_OPTIONS)
    for got in results(launch([str(script)], 2, switch=switch)):
        assert got["timeout"] == 77.0
        assert got["sum"] == 3.0
        assert got["hint"] == "65536"
        assert got["gloo_options_timeout"] == 33.0
        assert (
            "pg_options of type object do not apply to torchcomms backend 'shm'" in (got["refused"])
        )


_RECORDER = textwrap.dedent(
    """
    import json, torch, torch.distributed as dist
    from torchcomms.hooks import FlightRecorderHook
    dist.init_process_group("shm")
    for _ in range(3):
        dist.all_reduce(torch.ones(10))
    hooks = FlightRecorderHook.attached_to(dist.group.WORLD.get_comm())
    entries = hooks[0].dump_dict()["entries"] if hooks else []
    print("RESULT " + json.dumps({"hooks": len(hooks),
          "max": hooks[0].max_entries if hooks else 0,
          "ops": [e["profiling_name"] for e in entries]}), flush=True)
    dist.destroy_process_group()
    """
)


@pytest.mark.parametrize("size", ["0", "50"])
def test_flight_recorder_follows_c10d_buffer_size(size: str, tmp_path: Path) -> None:
    script = tmp_path / "recorder.py"
    script.write_text(_RECORDER)
    got = results(launch([str(script)], 2, switch=False, extra={"TORCH_FR_BUFFER_SIZE": size}))
    for rank in got:
        if size == "0":
            assert rank["hooks"] == 0  # nothing observes the calls: the lean lane
        else:
            # Not isolated: it records into the process-wide ring, as under the switch.
            assert rank["hooks"] == 1
            assert sum("all_reduce" in op for op in rank["ops"]) == 3, rank["ops"]


_FABRIC = textwrap.dedent(
    """
    import json, torch
    from torch import nn
    from lightning_fabric import Fabric
    from lightning_fabric.strategies import DDPStrategy
    fabric = Fabric(accelerator="cpu", devices=2, num_nodes=1,
                    strategy=DDPStrategy(process_group_backend="shm"))
    fabric.launch()
    import torch.distributed as dist
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = fabric.setup(model, opt)
    gen = torch.Generator().manual_seed(fabric.global_rank)
    for _ in range(3):
        loss = model(torch.randn(4, 8, generator=gen)).pow(2).mean()
        fabric.backward(loss)
        opt.step(); opt.zero_grad()
    weights = [p.detach().clone() for p in model.parameters()]
    gathered = fabric.all_gather(weights[0])
    print("RESULT " + json.dumps({"backend": dist.get_backend(),
          "same": bool(torch.equal(gathered[0], gathered[1])),
          "sum": weights[0].sum().item()}), flush=True)
    """
)

_ACCELERATE = textwrap.dedent(
    """
    import json, torch
    from torch import nn
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs
    # Accelerate on CPU takes only "gloo" or "mpi" (its own check); under the switch,
    # TORCHCOMM_C10D_ALIASES=gloo=shm serves that name with torchcomms' shm.
    acc = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    import torch.distributed as dist
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    gen = torch.Generator().manual_seed(acc.process_index)
    for _ in range(3):
        loss = model(torch.randn(4, 8, generator=gen)).pow(2).mean()
        acc.backward(loss)
        opt.step(); opt.zero_grad()
    w = acc.unwrap_model(model).weight.detach().clone()
    gathered = acc.gather(w.unsqueeze(0))
    print("RESULT " + json.dumps({"backend": dist.group.WORLD.get_comm().get_backend(),
          "distributed_type": str(acc.distributed_type),
          "same": bool(torch.equal(gathered[0], gathered[1])),
          "sum": w.sum().item()}), flush=True)
    """
)


@pytest.mark.parametrize("client", ["lightning_fabric", "accelerate"])
def test_training_libraries_run_ddp_on_shm(client: str, tmp_path: Path) -> None:
    pytest.importorskip(client, reason=f"{client} is not installed (scripts/install-dev.sh)")
    script = tmp_path / f"{client}_ddp.py"
    script.write_text(_FABRIC if client == "lightning_fabric" else _ACCELERATE)
    accelerate = client == "accelerate"
    extra = {"TORCHCOMM_C10D_ALIASES": "gloo=shm"} if accelerate else None
    got = results(launch([str(script)], 2, switch=accelerate, extra=extra))
    for rank in got:
        assert rank["backend"] == "shm"
        assert rank["same"], "DDP left the ranks' weights apart"
    assert got[0]["sum"] == got[1]["sum"]

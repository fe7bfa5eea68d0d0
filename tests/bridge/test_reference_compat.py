"""Code written for the reference's torchcomms runs unchanged (../shared/REFERENCE_API.md).

Each test drives one part of the sheet the way reference code does, on real gloo ranks
where communication is involved.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
import torch

import torchcomms
from torchcomms import OpName, ReduceOp
from torchcomms_core.foundation import torch_compat
from torchcomms_core.testing import unique_name

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHCOMM_", "MASTER_"))
        and k not in ("RANK", "WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE")
    }
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


# -- 1. signatures ------------------------------------------------------------------------


def body_positional_signatures() -> list[float]:
    # new_comm(backend, device, name, abort_process_on_timeout_or_error, timeout,
    #          is_high_priority_stream, store, enable_reconfigure, hints)
    comm = torchcomms.new_comm(
        "gloo",
        torch.device("cpu"),
        unique_name("pos"),
        False,
        timedelta(seconds=30),
        None,
        None,
        False,
        {"k": "v"},
    )
    r, n = comm.get_rank(), comm.get_size()
    t = torch.full((2,), float(r))
    comm.all_reduce(t, ReduceOp.SUM, False, None, timedelta(seconds=30))
    out = torch.zeros(n)
    comm.all_gather_single(out, torch.full((1,), float(r)), False, {}, timedelta(seconds=30))
    v = torch.zeros(2)
    comm.reduce(v, 0, ReduceOp.SUM, True, None, timedelta(seconds=30)).wait()
    comm.barrier(False, None, timedelta(seconds=30))
    comm.finalize()
    return [float(t[0]), *out.tolist()]


def test_reference_positional_orders_work(pool) -> None:
    n = pool.world_size
    expected = [float(sum(range(n))), *[float(r) for r in range(n)]]
    assert pool.run(body_positional_signatures) == [expected] * n


# -- 2. types -----------------------------------------------------------------------------


def test_types_and_defaults_follow_the_sheet() -> None:
    assert [m.name for m in torchcomms.P2POpType] == ["SEND", "RECV"]
    assert int(torchcomms.P2POpType.RECV) == 1
    op = torchcomms.P2POp(torchcomms.P2POpType.SEND, torch.ones(2), 3)
    op.peer = 1
    assert (op.type, op.peer) == (torchcomms.P2POpType.SEND, 1)
    opts = torchcomms.BatchP2POptions()
    assert opts.timeout == timedelta(0) and opts.hints == {}
    for name in ("Send", "AllReduce", "AllToAllvSingle", "Barrier", "AllGatherPExec"):
        o = getattr(torchcomms, f"{name}Options")()
        assert o.timeout == timedelta(0) and o.hints == {}
    defaults = torchcomms.CommOptions()
    assert defaults.timeout == timedelta(seconds=600)
    assert defaults.abort_process_on_timeout_or_error is True
    assert defaults.store is None and defaults.enable_reconfigure is False
    assert defaults.hints == {}
    assert torchcomms.CommOptions() != torchcomms.CommOptions()  # identity, like the binding
    assert ReduceOp(opType=torchcomms.RedOpType.MAX).type is torchcomms.RedOpType.MAX
    assert [s.name for s in torchcomms.WorkStatus] == [
        "NOT_STARTED",
        "INPROGRESS",
        "COMPLETED",
        "TIMEDOUT",
        "ERROR",
    ]
    assert torchcomms.InitHandle is str
    assert issubclass(torchcomms.Timeout, timedelta)
    r = torchcomms.ReconfigureOptions(7, {"a", "b"}, timedelta(seconds=3), {"x": "y"})
    assert (r.uuid, r.init_handles, r.timeout, r.hints) == (
        7,
        {"a", "b"},
        timedelta(seconds=3),
        {"x": "y"},
    )


def test_abort_on_error_default_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("TORCHCOMM_ABORT_ON_ERROR", raising=False)
    assert torchcomms.CommOptions().abort_process_on_timeout_or_error is True
    monkeypatch.setenv("TORCHCOMM_ABORT_ON_ERROR", "no")
    assert torchcomms.CommOptions().abort_process_on_timeout_or_error is False
    monkeypatch.setenv("TORCHCOMM_ABORT_ON_ERROR", "maybe")
    with pytest.raises(ValueError, match="TORCHCOMM_ABORT_ON_ERROR"):
        torchcomms.CommOptions()


def body_work_and_batch_types() -> dict:
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), unique_name("types"))
    r, n = comm.get_rank(), comm.get_size()
    statuses = []
    comm.register_pre_hook(lambda name, op_id, args: statuses.append(args.work.status))
    batch = comm.batch_op_create()
    got = torch.zeros(3)
    # ops is read/write: build the list by hand, as reference code may.
    batch.ops = [
        torchcomms.P2POp(torchcomms.P2POpType.SEND, torch.full((3,), float(r)), (r + 1) % n),
        torchcomms.P2POp(torchcomms.P2POpType.RECV, got, (r - 1) % n),
    ]
    work = batch.issue(True, torchcomms.BatchP2POptions(timedelta(seconds=20)))
    work.wait()
    manual = torchcomms.TorchWork()
    manual._set_status(torchcomms.WorkStatus.ERROR)
    out = {
        "got": got.tolist(),
        "pre_status": statuses[0].name,
        "after": work.status.name,
        "manual": manual.status.name,
        "copy": copy.copy(comm) is comm and copy.deepcopy({"c": comm})["c"] is comm,
        "version": comm.get_backend_version(),
        "handle": isinstance(comm.get_init_handle(), torchcomms.InitHandle),
    }
    comm.finalize()
    return out


def test_work_status_batch_and_copies(pool) -> None:
    n = pool.world_size
    for r, out in enumerate(pool.run(body_work_and_batch_types)):
        assert out["got"] == [float((r - 1) % n)] * 3
        assert out["pre_status"] == "NOT_STARTED"  # pre-hooks run before the engine starts
        assert out["after"] == "COMPLETED" and out["manual"] == "ERROR"
        assert out["copy"] and out["handle"]
        assert out["version"] and isinstance(out["version"], str)


# -- 3. hook arguments --------------------------------------------------------------------


def body_hook_fields() -> dict:
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), unique_name("hookf"))
    r, n = comm.get_rank(), comm.get_size()
    pre: dict[str, tuple] = {}
    post: list[str] = []

    def on_pre(name, op_id, args) -> None:
        key = str(name)
        if key in ("send", "recv"):
            pre[key] = (type(args).__name__, args.peer, args.async_op)
        elif key == "all_gather":
            pre[key] = (type(args).__name__, len(args.output), tuple(args.input.shape))
        elif key == "reduce_scatter":
            pre[key] = (type(args).__name__, len(args.input), tuple(args.output.shape))
        elif key == "all_to_all_v_single":
            pre[key] = (type(args).__name__, args.input_split_sizes, args.output_split_sizes)
        elif key == "scatter":
            pre[key] = (type(args).__name__, tuple(args.output.shape), args.root)
        elif key == "batch_op_issue":
            pre[key] = (type(args).__name__, args.num_ops, args.async_op)
        elif key == "split":
            pre[key] = (type(args).__name__, args.ranks, args.name)
        elif key == "finalize":
            pre[key] = (type(args).__name__, op_id, name is OpName.finalize)

    comm.register_pre_hook(on_pre)
    comm.register_post_hook(lambda op_id, args: post.append(type(args).__name__))
    peer_to, peer_from = (r + 1) % n, (r - 1) % n
    if r % 2 == 0:
        comm.send(torch.ones(1), peer_to)
        comm.recv(torch.zeros(1), peer_from)
    else:
        comm.recv(torch.zeros(1), peer_from)
        comm.send(torch.ones(1), peer_to)
    comm.all_gather([torch.zeros(2) for _ in range(n)], torch.ones(2))
    comm.reduce_scatter(torch.zeros(2), [torch.ones(2) for _ in range(n)], ReduceOp.SUM)
    comm.all_to_all_v_single(torch.zeros(n), torch.ones(n), [1] * n, [1] * n)
    comm.scatter(torch.zeros(2), [torch.ones(2)] * n if r == 0 else [], 0)
    comm.batch_op_create().send(torch.ones(1), peer_to).recv(torch.zeros(1), peer_from).issue()
    sub = comm.split(list(range(n)), unique_name("hooksplit"))
    sub.finalize()
    comm.finalize()
    return {"pre": pre, "post": post}


def test_hook_arguments_have_the_reference_fields(pool) -> None:
    n = pool.world_size
    for out in pool.run(body_hook_fields):
        pre = out["pre"]
        assert pre["send"] == ("SendPreHookArgs", pre["send"][1], False)
        assert pre["recv"][0] == "RecvPreHookArgs"
        assert pre["all_gather"] == ("AllGatherPreHookArgs", n, (2,))
        assert pre["reduce_scatter"] == ("ReduceScatterPreHookArgs", n, (2,))
        assert pre["all_to_all_v_single"] == ("AllToAllVSinglePreHookArgs", [1] * n, [1] * n)
        assert pre["scatter"] == ("ScatterPreHookArgs", (2,), 0)
        assert pre["batch_op_issue"] == ("BatchOpIssuePreHookArgs", 2, False)
        assert pre["split"][0] == "SplitPreHookArgs" and pre["split"][1] == list(range(n))
        assert pre["finalize"] == ("FinalizePreHookArgs", 2**64 - 1, True)
        assert "CollectivePostHookArgs" in out["post"]
        assert "BatchOpIssuePostHookArgs" in out["post"]
        assert "SplitPostHookArgs" in out["post"] and out["post"][-1] == "FinalizePostHookArgs"


def test_op_names_have_the_reference_values() -> None:
    assert OpName.send == 0 and OpName.all_reduce == 3 and OpName.gather_single == 17
    assert OpName.split == 18 and OpName.new_window == 19 and OpName.finalize == 21


def test_old_hook_field_names_warn() -> None:
    cls = torchcomms.AllGatherPreHookArgs
    args = cls("all_gather", 1, ([torch.zeros(1)], torch.ones(1)), False, None, None)
    assert args.input.shape == (1,)
    with pytest.warns(DeprecationWarning, match="reference's names"):
        assert len(args.tensor_list) == 1


# -- 4. top level ---------------------------------------------------------------------------


def test_top_level_helpers() -> None:
    assert torchcomms.is_backend_built("gloo")
    assert not torchcomms.is_backend_built("no_such_backend")
    assert "gloo" in torchcomms.built_backends()
    torchcomms._load_backend("gloo")
    assert torchcomms._is_backend_registered("gloo")
    with pytest.raises(ModuleNotFoundError, match="no torchcomms backend named"):
        torchcomms._load_backend("no_such_backend")
    with pytest.raises(torchcomms.TorchCommError, match="has no memory allocator"):
        torchcomms.get_mem_allocator("gloo")
    from torchcomms._comms import (  # noqa: F401
        ReduceOp,
        TorchCommBackend,
        _BackendWrapper,
        _BackendWrapperOptions,
        _is_backend_registered,
    )


def test_submodules_are_bound_at_import_and_torch_test_utilities_import() -> None:
    code = textwrap.dedent("""
        import torchcomms
        assert torchcomms.hooks.FlightRecorderHook and torchcomms.objcol.all_gather_object
        import torch.testing._internal.common_distributed as cd
        assert cd.TORCHCOMM_HAS_GLOO, "common_distributed did not see the gloo backend"
        print("ok")
    """)
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=_clean_env(),
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().endswith("ok")


def test_torch_distributed_first_still_finds_the_bridge() -> None:
    code = textwrap.dedent("""
        import torch.distributed.distributed_c10d as c10d
        assert c10d._TORCHCOMM_AVAILABLE, "torch could not import torchcomms' bridge"
        print("ok")
    """)
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=_clean_env(),
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-3000:]


# -- 8. FileStore rendezvous through TORCHCOMM_STORE_PATH -------------------------------------

STORE_PATH_SCRIPT = textwrap.dedent("""
    import torch, torchcomms
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "filestore")
    t = torch.ones(2)
    comm.all_reduce(t, torchcomms.ReduceOp.SUM, False)
    print("sum", t[0].item(), flush=True)
    comm.finalize()
""")


def test_store_path_rendezvous(tmp_path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", STORE_PATH_SCRIPT],
            cwd=ROOT,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_clean_env(
                TORCHCOMM_RANK=str(r),
                TORCHCOMM_SIZE="2",
                TORCHCOMM_STORE_PATH=str(tmp_path / "store"),
            ),
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert "sum 2.0" in out


# -- 9. backends written the reference's way ---------------------------------------------------


def body_reference_style_backend() -> tuple[list[float], list[float], int]:
    carrier = torchcomms.new_comm("gloo", torch.device("cpu"), unique_name("carrier"))
    calls = {"n": 0}

    class Plain(torchcomms.TorchCommBackend):
        def init(self, device, name, options):
            self._rank, self._size, self._name = options.rank, options.size, name

        def finalize(self):
            pass

        def get_rank(self):
            return self._rank

        def get_size(self):
            return self._size

        def get_backend_name(self):
            return "plain"

        def get_comm_name(self):
            return self._name

        def send(self, tensor, dst, async_op):
            return carrier.send(tensor, dst, async_op)

        def recv(self, tensor, src, async_op):
            return carrier.recv(tensor, src, async_op)

        def all_reduce(self, tensor, op, async_op):
            calls["n"] += 1
            return carrier.all_reduce(tensor, op, async_op)

    name = unique_name("plainbackend")
    torchcomms.register_backend(name, Plain)
    comm = torchcomms.new_comm(name, torch.device("cpu"), unique_name("plain"))
    x = torch.ones(3)
    comm.all_reduce(x, ReduceOp.SUM, False, None, timedelta(seconds=10))
    y = torch.full((2,), float(comm.get_rank()))
    comm.broadcast(y, 0, True).wait()  # derived by the core from send/recv
    comm.finalize()
    carrier.finalize()
    torchcomms.unregister_backend(name)
    return x.tolist(), y.tolist(), calls["n"]


def test_reference_style_backend_without_keywords(pool) -> None:
    n = pool.world_size
    assert pool.run(body_reference_style_backend) == [([float(n)] * 3, [0.0, 0.0], 1)] * n


# -- the example ----------------------------------------------------------------------------


def _first_failure(output: str) -> str:
    """What the ranks said when one failed: their own lines other than passed steps
    (not the launcher's log lines), so the failed step and the first traceback show, then
    the end of the output."""
    own = [
        line
        for line in output.splitlines()
        if not line.startswith(("W1", "E1", "I1", "ok "))
        and "torch/distributed/elastic" not in line
    ]
    return "\n".join(own[:80]) + "\n...\n" + output[-1500:]


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4])
def test_reference_style_example_runs_unchanged(nproc: int) -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "examples/reference_style.py",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=_clean_env(),
        cwd=ROOT,
    )
    assert res.returncode == 0, _first_failure(res.stdout + res.stderr)
    assert res.stdout.count("reference-style script done") == nproc
    assert "FAILED" not in res.stdout


# -- 10. gloo address variables and hints ------------------------------------------------------


def body_gloo_binds_where_told(how: str) -> float:
    hints = {}
    if how == "hint_interface":
        hints = {"interface": "lo"}
    elif how == "env_hostname":
        os.environ["TORCHCOMM_GLOO_HOSTNAME"] = "127.0.0.1"
    try:
        comm = torchcomms.new_comm("gloo", torch.device("cpu"), unique_name("bind"), hints=hints)
    finally:
        os.environ.pop("TORCHCOMM_GLOO_HOSTNAME", None)
    t = torch.ones(1)
    comm.all_reduce(t, ReduceOp.SUM)
    comm.finalize()
    return float(t[0])


@pytest.mark.parametrize("how", ["hint_interface", "env_hostname"])
def test_gloo_binds_to_a_hinted_interface_or_hostname(pool2, how) -> None:
    assert pool2.run(body_gloo_binds_where_told, how) == [2.0, 2.0]


def body_gloo_bad_interface_hint() -> str:
    try:
        torchcomms.new_comm(
            "gloo", torch.device("cpu"), unique_name("badif"), hints={"interface": "no_such_if0"}
        )
    except torchcomms.CommInputError as exc:
        return "refused" if "no_such_if0" in str(exc) else str(exc)
    return "no error"


def test_an_unusable_interface_hint_is_refused_clearly(pool2) -> None:
    assert pool2.run(body_gloo_bad_interface_hint) == ["refused", "refused"]


# -- 8. torch's own routes: _register_backend and multi-device backend strings -----------------

REGISTER_SCRIPT = textwrap.dedent("""
    import os, sys, tempfile
    import torch, torch.distributed as dist
    import torchcomms
    from torchcomms._comms import _BackendWrapper
    fs = dist.FileStore(tempfile.mktemp(), 1)
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), "reg", store=dist.PrefixStore("a", fs))
    pg = dist.ProcessGroup(dist.PrefixStore("pg", fs), 0, 1)
    try:
        pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM,
                             _BackendWrapper(comm))
    except torchcomms.CommTypeError as exc:
        assert "_create_torchcomm_process_group" in str(exc), exc
        print("refused clearly")
    else:
        pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        t = torch.full((3,), 2.0)
        pg.allreduce([t]).wait()
        print("registered", t.tolist())
    comm.finalize()
""")

MULTI_DEVICE_SCRIPT = textwrap.dedent("""
    import os, tempfile
    os.environ["TORCH_DISTRIBUTED_USE_TORCHCOMMS"] = "1"
    import torch, torch.distributed as dist
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method="file://" + tempfile.mktemp(),
                            rank=0, world_size=1)
    t = torch.ones(2)
    dist.all_reduce(t)
    print("group", type(dist.group.WORLD).__name__, dist.get_backend(), t.tolist())
    dist.destroy_process_group()
""")


def test_registering_a_wrapper_inside_a_group_names_the_supported_route() -> None:
    res = subprocess.run(
        [sys.executable, "-c", REGISTER_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        env=_clean_env(TORCHCOMM_RANK="0", TORCHCOMM_SIZE="1"),
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    if torch_compat.PYTHON_C10D_BACKEND:
        # torch 2.14: the wrapper runs inside the group through a Python c10d Backend.
        assert "registered [2.0, 2.0, 2.0]" in res.stdout
    else:
        assert "refused clearly" in res.stdout


def test_multi_device_backend_string_under_the_switch() -> None:
    res = subprocess.run(
        [sys.executable, "-c", MULTI_DEVICE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        env=_clean_env(),
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    # On a machine without CUDA only the CPU part exists; the group runs on torchcomms.
    assert "group _BackendWrapper" in res.stdout and "[1.0, 1.0]" in res.stdout

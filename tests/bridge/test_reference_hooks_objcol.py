"""Reference-style use of ``objcol``, ``device_mesh`` helpers and the shipped hooks.

Each body is written against Meta's torchcomms API as its reference sheet gives it
(argument order, defaults, module layout) and runs on real gloo ranks.
"""

from __future__ import annotations

import json
import os
import pickle
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import torchcomms
from torchcomms_core.testing import unique_name


def _comm(**kwargs):
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("ref"), **kwargs)


def _caught(fn, *args, **kwargs) -> tuple[str, str]:
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # the test inspects type and message
        return type(exc).__name__, str(exc)
    return "no error", ""


def _cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# -- device_mesh -------------------------------------------------------------------------


def body_create_process_group() -> dict:
    from torch.distributed import distributed_c10d as c10d

    from torchcomms.device_mesh import _create_torchcomm_process_group, init_device_mesh

    try:
        world = _comm()
        init_device_mesh((world,), ("world",))
        r = world.get_rank()
        row = r // 2
        pair = world.split([2 * row, 2 * row + 1], unique_name("pair"))
        name = unique_name("grp")
        pg = _create_torchcomm_process_group(
            pair, name, global_ranks_mapping={2 * row: 0, 2 * row + 1: 1}
        )
        t = torch.tensor([float(r + 1)])
        dist.all_reduce(t, group=pg)
        out = torch.empty(2, dtype=torch.int64)
        dist.all_gather_into_tensor(out, torch.tensor([r]), group=pg)
        plain = _create_torchcomm_process_group(_comm(), unique_name("plain"), "mybackend")
        return {
            "sum": t.item(),
            "order": out.tolist(),
            "backend": dist.get_backend(pg),
            "plain_backend": dist.get_backend(plain),
            "ranks": dist.get_process_group_ranks(pg),
            "plain_ranks": dist.get_process_group_ranks(plain),
            "tag": c10d._world.pg_to_tag[pg] == f"ptd:{name}",
            "resolved": c10d._resolve_process_group(name) is pg,
            "group_rank": dist.get_rank(pg),
            "comm": pg.get_comm() is pair,
            "duplicate": _caught(_create_torchcomm_process_group, pair, name),
            "swapped": _caught(
                _create_torchcomm_process_group,
                pair,
                unique_name("x"),
                global_ranks_mapping={2 * row: 1, 2 * row + 1: 0},
            ),
            "bad_mapping": _caught(
                _create_torchcomm_process_group, pair, unique_name("x"), global_ranks_mapping={0: 0}
            ),
        }
    finally:
        _cleanup()


def test_create_torchcomm_process_group_registers_the_comm(pool4) -> None:
    for r, out in enumerate(pool4.run(body_create_process_group)):
        row = r // 2
        assert out["sum"] == float(4 * row + 3)
        assert out["order"] == [2 * row, 2 * row + 1]
        assert out["backend"] == "torchcomm" and out["plain_backend"] == "mybackend"
        assert out["ranks"] == [2 * row, 2 * row + 1] and out["plain_ranks"] == [0, 1, 2, 3]
        assert out["tag"] and out["resolved"] and out["comm"]
        assert out["group_rank"] == r % 2
        kind, message = out["duplicate"]
        assert kind == "CommInputError" and "already registered" in message
        kind, message = out["swapped"]
        assert kind == "CommInputError" and f"(global rank {r}) to {1 - r % 2}" in message
        kind, message = out["bad_mapping"]
        assert kind == "CommInputError" and "group rank 0..1" in message


def body_flatten_with_comm() -> dict:
    from torch.distributed._mesh_layout import _MeshLayout

    from torchcomms.device_mesh import _flatten_with_comm, init_device_mesh

    try:
        world = _comm()
        r = world.get_rank()
        row, col = divmod(r, 2)
        tp = world.split([row * 2, row * 2 + 1], "tp")
        dp = world.split([col, col + 2], "dp")
        mesh = init_device_mesh((dp, tp), ("dp", "tp"), _global_comm=world)
        flat_comm = world.split([0, 1, 2, 3], unique_name("flat"))
        layout = _MeshLayout([mesh._layout.collapse()])
        flat = _flatten_with_comm(mesh, "dp_tp", flat_comm, [0, 1, 2, 3], layout)
        group = mesh["dp_tp"].get_group()
        t = torch.tensor([float(r)])
        dist.all_reduce(t, group=group)
        again = _caught(_flatten_with_comm, mesh, "dp_tp", flat_comm, [0, 1, 2, 3], layout)
        wrong = _caught(_flatten_with_comm, mesh, "other", flat_comm, [3, 2, 1, 0], layout)
        return {
            "mesh": flat.mesh.tolist(),
            "names": flat.mesh_dim_names,
            "same": group.get_comm() is flat_comm,
            "sum": t.item(),
            "by_name": mesh.get_group("dp_tp") is group,
            "again": again,
            "wrong": wrong,
        }
    finally:
        _cleanup()


def test_flatten_with_comm_adds_a_dimension_on_the_given_comm(pool4) -> None:
    for out in pool4.run(body_flatten_with_comm):
        assert out["mesh"] == [0, 1, 2, 3] and out["names"] == ("dp_tp",)
        assert out["same"] and out["by_name"] and out["sum"] == 6.0
        assert out["again"][0] == "CommInputError" and "already has" in out["again"][1]
        assert out["wrong"][0] == "CommInputError" and "global_ranks is" in out["wrong"][1]


# -- objcol ------------------------------------------------------------------------------


class Point:
    """A plain class: ``weights_only`` decoding refuses it, pickle rebuilds it."""

    def __init__(self, x: int) -> None:
        self.x = x


SHEET_OBJCOL = {
    "all_gather_object": "(comm, object_list, obj, timeout=None, weights_only=True)",
    "gather_object": "(comm, obj, root, object_gather_list=None, timeout=None, weights_only=True)",
    "send_object_list": "(comm, object_list, dst, timeout=None)",
    "recv_object_list": "(comm, object_list, src, timeout=None, weights_only=True)",
    "broadcast_object_list": "(comm, object_list, root, timeout=None, weights_only=True)",
    "scatter_object_list": "(comm, root, scatter_object_output_list, "
    "scatter_object_input_list=None, timeout=None, weights_only=True)",
}


def test_objcol_signatures_are_the_sheets() -> None:
    import inspect

    from torchcomms import objcol

    for name, expected in SHEET_OBJCOL.items():
        sig = inspect.signature(getattr(objcol, name))
        plain = (
            "("
            + ", ".join(
                p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
                for p in sig.parameters.values()
            )
            + ")"
        )
        assert plain == expected, name
        assert all(
            p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in sig.parameters.values()
        ), name


def body_objcol_reference_order() -> dict:
    from torchcomms import objcol

    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    t30 = timedelta(seconds=30)
    res: dict = {}
    everyone = [None] * n
    objcol.all_gather_object(comm, everyone, {"r": r}, t30, True)
    res["all_gather"] = everyone
    gathered = [None] * n if r == n - 1 else None
    objcol.gather_object(comm, ("from", r), n - 1, gathered, t30, True)
    res["gather"] = gathered
    lst = ["a", {"b": 2}] if r == 1 else [None, None]
    objcol.broadcast_object_list(comm, lst, 1, t30, True)
    res["broadcast"] = lst
    out = [None]
    objcol.scatter_object_list(
        comm, 0, out, [k * 10 for k in range(n)] if r == 0 else None, t30, True
    )
    res["scatter"] = out[0]
    if r == 0:
        objcol.send_object_list(comm, [torch.arange(3), "x"], 1, t30)
    elif r == 1:
        got = [None, None]
        objcol.recv_object_list(comm, got, 0, t30, True)
        res["p2p"] = [got[0].tolist(), got[1]]
    # The earlier order of this package is explained, on every rank alike.
    res["old_gather"] = _caught(objcol.gather_object, comm, r, [None] * n, root=0)
    res["old_scatter"] = _caught(objcol.scatter_object_list, comm, [None], None)
    comm.finalize()
    return res


def test_objcol_in_the_reference_order(pool) -> None:
    n = pool.world_size
    res = pool.run(body_objcol_reference_order)
    for r, out in enumerate(res):
        assert out["all_gather"] == [{"r": k} for k in range(n)]
        assert out["gather"] == ([("from", k) for k in range(n)] if r == n - 1 else None)
        assert out["broadcast"] == ["a", {"b": 2}]
        assert out["scatter"] == 10 * r
        kind, message = out["old_gather"]
        assert kind == "CommTypeError" and "multiple values for argument 'root'" in message
        assert "gather_object(comm, obj, root, object_gather_list=None" in message
        kind, message = out["old_scatter"]
        assert kind == "CommTypeError" and "root must be a rank (int), got list" in message
    assert res[1]["p2p"] == [[0, 1, 2], "x"]


def body_pickle_serialization(everywhere: bool) -> tuple:
    from torchcomms import objcol

    comm = _comm()
    r = comm.get_rank()
    if everywhere or r == 0:
        os.environ["TORCHCOMMS_SERIALIZATION"] = "pickle"
    try:
        lst = [Point(7)] if r == 0 else [None]
        # weights_only=True explicitly: the variable wins, as in the reference.
        outcome = _caught(objcol.broadcast_object_list, comm, lst, 0, None, True)
        got = lst[0].x if r and outcome[0] == "no error" else None
        default = [Point(1)] if r == 0 else [None]
        refused = None
        if not everywhere:
            os.environ.pop("TORCHCOMMS_SERIALIZATION", None)
            refused = _caught(objcol.broadcast_object_list, comm, default, 0)
        comm.finalize()
        return outcome, got, refused
    finally:
        os.environ.pop("TORCHCOMMS_SERIALIZATION", None)


def test_pickle_serialization_decodes_with_pickle_and_only_where_set(pool2) -> None:
    (_, _, _), (outcome, got, _) = pool2.run(body_pickle_serialization, True)
    assert outcome == ("no error", "") and got == 7
    _, (outcome, _, refused) = pool2.run(body_pickle_serialization, False)
    kind, message = outcome
    assert kind == "UnsafeObjectError" and "plain pickle" in message
    assert "TORCHCOMMS_SERIALIZATION=pickle on every rank" in message
    kind, message = refused
    assert kind == "UnsafeObjectError" and "needs full pickle" in message


# -- hooks: module layout ----------------------------------------------------------------


def test_hooks_module_is_laid_out_as_the_reference() -> None:
    import inspect

    import torchcomms.hooks as hooks
    from torchcomms.hooks.clog import clog
    from torchcomms.hooks.fr import FlightRecorderHook
    from torchcomms.hooks.nan_check import NanCheckHook

    assert hooks.__all__ == ["clog", "FlightRecorderHook", "NanCheckHook"]
    assert (hooks.clog, hooks.FlightRecorderHook, hooks.NanCheckHook) == (
        clog,
        FlightRecorderHook,
        NanCheckHook,
    )
    assert hooks.fr.FlightRecorderHook is FlightRecorderHook
    assert hooks.nan_check.NanCheckHook is NanCheckHook
    assert {c.__module__ for c in (clog, FlightRecorderHook, NanCheckHook)} == {"torchcomms.hooks"}
    assert str(inspect.signature(FlightRecorderHook)) == (
        "(max_entries: 'int' = 2048, isolated: 'bool' = False) -> 'None'"
    )
    assert str(inspect.signature(NanCheckHook)) == (
        "(check_inputs: 'bool' = True, check_outputs: 'bool' = False) -> 'None'"
    )
    assert list(inspect.signature(clog).parameters) == ["output", "events", "verbose"]
    assert inspect.signature(clog).parameters["verbose"].default == []
    from torch._C._distributed_c10d import _get_handler_names

    assert {
        "torchcomms_fr_trace_json",
        "torchcomms_fr_dump_file",
        "torchcomms_health_check",
    } <= set(_get_handler_names())
    with pytest.raises(ValueError, match="use any of"):
        clog("stderr", ["SOMETIMES"])


def test_the_process_wide_recorder_is_sized_by_the_environment(monkeypatch) -> None:
    from torchcomms.hooks import FlightRecorderHook

    # The process-wide recorder lives in the flight recorder's hook module.
    from torchcomms_core.hooks.flight_recorder import hook as flight_recorder

    monkeypatch.setattr(flight_recorder, "_global", None)
    monkeypatch.setenv("TORCHCOMM_FR_BUFFER_SIZE", "7")
    shared = FlightRecorderHook(max_entries=50)
    assert shared.max_entries == 7 and not shared.isolated
    assert not shared.is_enabled()  # not registered with a communicator yet
    assert FlightRecorderHook()._recorder is shared._recorder
    assert FlightRecorderHook(50, isolated=True).max_entries == 50
    monkeypatch.setattr(flight_recorder, "_global", None)
    monkeypatch.setenv("TORCHCOMM_FR_BUFFER_SIZE", "0")
    assert not FlightRecorderHook().is_enabled()
    monkeypatch.setattr(flight_recorder, "_global", None)
    monkeypatch.setenv("TORCHCOMM_FR_BUFFER_SIZE", "lots")
    with pytest.raises(ValueError, match="TORCHCOMM_FR_BUFFER_SIZE='lots' is not an integer"):
        FlightRecorderHook()
    # Before any communicator is registered, the dump handler answers 503.
    from torchcomms_core.hooks.debug_handlers import torchcomms_fr_dump_file

    monkeypatch.setattr(flight_recorder, "_global", None)
    monkeypatch.delenv("TORCHCOMM_FR_BUFFER_SIZE")
    reply = _Reply()
    torchcomms_fr_dump_file(_Request({}), reply)
    assert reply.status == 503 and "register one with" in reply.body


class _Request:
    def __init__(self, params: dict) -> None:
        self.params = params

    def get_param(self, name: str) -> str:
        return self.params.get(name, "")


class _Reply:
    status, body = 0, ""

    def set_content(self, body: str, kind: str) -> None:
        self.body = body

    def set_status(self, status: int) -> None:
        self.status = status


# -- hooks: flight recorder --------------------------------------------------------------


def body_flight_recorder(dump_dir: str) -> dict:
    from torchcomms import ReduceOp
    from torchcomms.hooks import FlightRecorderHook

    os.environ["TORCHCOMM_FR_DUMP_TEMP_FILE"] = os.path.join(dump_dir, "trace_")
    try:
        comm = _comm()
        r = comm.get_rank()
        fr = FlightRecorderHook()
        fr.reset()
        fr.register_with_comm(comm)
        comm.all_reduce(torch.ones(4), ReduceOp.SUM)
        comm.barrier()
        work = comm.all_reduce(torch.ones(2), ReduceOp.SUM, True)
        active = json.loads(fr.dump_json(include_completed=False))["entries"]
        work.wait()
        full = json.loads(fr.dump_json())
        shared = FlightRecorderHook(max_entries=5)
        iso = FlightRecorderHook(max_entries=2, isolated=True).register_with_comm(comm)
        for _ in range(3):
            comm.barrier()
        sizes = [len(fr), fr.size(), len(shared), len(iso), iso.size()]
        path = fr.dump_file(r)
        os.environ["TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME"] = "1"
        os.environ["TORCHCOMM_FR_DUMP_TEMP_FILE"] = os.path.join(dump_dir, f"whole-{r}.pkl")
        dynamic = fr.dump_file(r, include_completed=False)
        fr.reset()
        after = [len(fr), len(iso)]
        iso.unregister()
        fr.unregister()
        comm.finalize()
        return {
            "active": [e["profiling_name"] for e in active],
            "names": [e["profiling_name"] for e in full["entries"]],
            "states": [e["state"] for e in full["entries"]],
            "sizes": sizes,
            "path": path,
            "dynamic": dynamic,
            "after": after,
            "enabled": [fr.is_enabled(), iso.is_enabled()],
        }
    finally:
        for var in ("TORCHCOMM_FR_DUMP_TEMP_FILE", "TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME"):
            os.environ.pop(var, None)


def test_flight_recorder_hook_reference_api(pool2, tmp_path) -> None:
    res = pool2.run(body_flight_recorder, str(tmp_path))
    for r, out in enumerate(res):
        assert out["active"] == ["gloo:all_reduce"]
        assert out["names"] == ["gloo:all_reduce", "gloo:barrier", "gloo:all_reduce"]
        assert out["states"] == ["completed"] * 3
        assert out["sizes"] == [6, 6, 6, 2, 2]
        assert out["path"] == str(tmp_path / f"trace_{r}")
        assert out["dynamic"] == str(tmp_path / f"whole-{r}.pkl")
        assert out["after"] == [0, 2]
        assert out["enabled"] == [True, True]
    with open(tmp_path / "whole-0.pkl", "rb") as f:
        assert pickle.load(f)["entries"] == []  # include_completed=False: none active
    # The dump files are c10d's pickles: PyTorch's analyzer matches them across ranks.
    from torch.distributed.flight_recorder import fr_trace

    out = tmp_path / "db.pkl"
    fr_trace.main([str(tmp_path), "-p", "trace_", "-o", str(out)])
    with open(out, "rb") as f:
        _, db = pickle.load(f)
    assert len(db.collectives) == 6 and all(c.pass_check for c in db.collectives)


# -- hooks: debug handlers ---------------------------------------------------------------


def _post(port: int, handler: str, query: str = "") -> tuple[int, str]:
    import urllib.error
    import urllib.request

    url = f"http://127.0.0.1:{port}/handler/{handler}" + (f"?{query}" if query else "")
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, method="POST"), timeout=30
        ) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def body_debug_handlers(dump_dir: str) -> dict:
    import time

    from torch._C._distributed_c10d import _WorkerServer

    from torchcomms import ReduceOp
    from torchcomms.hooks import FlightRecorderHook
    from torchcomms_core.hooks import flight_recorder

    os.environ["TORCHCOMM_FR_DUMP_TEMP_FILE"] = os.path.join(dump_dir, "handler_")
    server = _WorkerServer("127.0.0.1", 0)
    try:
        flight_recorder._set_healthy(True)
        comm = _comm(abort_process_on_timeout_or_error=False)
        r = comm.get_rank()
        fr = FlightRecorderHook()
        fr.reset()
        fr.register_with_comm(comm)
        comm.all_reduce(torch.ones(3), ReduceOp.SUM)
        comm.all_gather_single(torch.empty(4), torch.ones(2))
        out = {
            "trace": _post(server.port, "torchcomms_fr_trace_json"),
            "active": _post(server.port, "torchcomms_fr_trace_json", "onlyactive=true"),
            "none": _post(server.port, "torchcomms_fr_trace_json", "includecollectives=false"),
            "bad": _post(server.port, "torchcomms_fr_trace_json", "onlyactive=maybe"),
            "healthy": _post(server.port, "torchcomms_health_check"),
        }
        out["dump"] = _post(server.port, "torchcomms_fr_dump_file")
        target = os.path.join(dump_dir, f"handler_{r}")
        deadline = time.monotonic() + 20
        while not os.path.exists(target) and time.monotonic() < deadline:
            time.sleep(0.05)
        out["dumped"] = os.path.exists(target)
        # Rank 1 waits for a message rank 0 never sends: the timeout fails the
        # communicator, which marks this process unhealthy (and dumps).
        if r == 1:
            out["timeout"] = _caught(
                comm.recv, torch.empty(1), 0, False, None, timedelta(milliseconds=300)
            )
        out["after"] = _post(server.port, "torchcomms_health_check")
        comm.abort()
        fr.unregister()
        return out
    finally:
        flight_recorder._set_healthy(True)
        os.environ.pop("TORCHCOMM_FR_DUMP_TEMP_FILE", None)
        server.shutdown()


def test_debug_handlers_answer_torchs_debug_server(pool2, tmp_path) -> None:
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig

    res = pool2.run(body_debug_handlers, str(tmp_path))
    details = {}
    for r, out in enumerate(res):
        status, text = out["trace"]
        assert status == 200
        trace = json.loads(text)
        assert [e["profiling_name"] for e in trace["entries"]] == [
            "gloo:all_reduce",
            "gloo:all_gather_single",
        ]
        assert out["active"][0] == 200 and json.loads(out["active"][1])["entries"] == []
        assert json.loads(out["none"][1])["entries"] == []
        assert out["bad"][0] == 400 and "onlyactive='maybe'" in out["bad"][1]
        assert json.loads(out["healthy"][1]) == {"healthy": True}
        assert out["dump"][0] == 200 and out["dumped"]
        assert json.loads(out["after"][1]) == {"healthy": r != 1}
        # What torch's FlightRecorderHandler does with the answers of every rank.
        details[f"rank{r}.json"] = {"rank": r, "host_name": f"host{r}", **trace}
    assert res[1]["timeout"][0] in ("CommTimeoutError", "CommOperationError")
    args = JobConfig().parse_args(args=[])
    args.allow_incomplete_ranks = True
    db = build_db(details, args, details["rank0.json"]["version"])
    assert len(db.collectives) == 2 and all(c.pass_check for c in db.collectives)


# -- hooks: NaN check and clog -----------------------------------------------------------


def body_nan_check() -> dict:
    from torchcomms import ReduceOp
    from torchcomms.hooks import NanCheckHook

    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    hook = NanCheckHook()
    hook.register_with_comm(comm)
    nan = torch.tensor([1.0, float("nan")])
    out = {
        "enabled": [hook.is_enabled(), NanCheckHook(False, False).is_enabled()],
        "all_reduce": _caught(comm.all_reduce, nan.clone(), ReduceOp.SUM),
    }
    t = torch.ones(2)
    comm.all_reduce(t, ReduceOp.SUM)  # the communicator is still usable
    out["sum"] = t.tolist()
    # Output buffers are not inputs: a NaN-filled receive buffer is fine by default.
    gathered = torch.full((2 * n,), float("nan"))
    comm.all_gather_single(gathered, torch.full((2,), float(r)))
    out["gathered"] = gathered.tolist()
    comm.all_reduce(torch.tensor([1, 2]), ReduceOp.SUM)  # integers are not checked
    if r == 0:
        out["send"] = _caught(comm.send, nan.clone(), 1)
        batch = comm.batch_op_create()
        batch.send(nan.clone(), 1)
        out["batch"] = _caught(batch.issue, False)
    elif r == 1:
        strict = NanCheckHook(check_inputs=False, check_outputs=True)
        strict.register_with_comm(comm)
        out["recv"] = _caught(comm.recv, torch.full((2,), float("nan")), 0)
        strict.unregister()
    comm.barrier()
    comm.finalize()
    return out


def test_nan_check_hook_refuses_nan_inputs_before_the_operation(pool2) -> None:
    res = pool2.run(body_nan_check)
    for out in res:
        assert out["enabled"] == [True, False]
        kind, message = out["all_reduce"]
        assert kind == "CommInputError" and "NaN found in the tensor of all_reduce" in message
        assert "the operation was not run" in message
        assert out["sum"] == [2.0, 2.0]
        assert out["gathered"] == [0.0, 0.0, 1.0, 1.0]
    assert res[0]["send"][0] == "CommInputError"
    assert "NaN found in the input of send" in res[0]["send"][1]
    assert "NaN found in the send ops[0] of batch_op_issue" in res[0]["batch"][1]
    assert res[1]["recv"][0] == "CommInputError"
    assert "NaN found in the output of recv" in res[1]["recv"][1]


def body_clog(log_dir: str) -> dict:
    from torchcomms import ReduceOp
    from torchcomms.hooks import clog

    comm = _comm()
    r = comm.get_rank()
    full_path = os.path.join(log_dir, f"full-{r}.log")
    brief_path = os.path.join(log_dir, f"brief-{r}.log")
    full = clog(full_path, ["ALL"], ["buffers"])
    full.register_with_comm(comm)
    brief = clog(brief_path, [])
    brief.register_with_comm(comm)
    comm.all_reduce(torch.ones(3), ReduceOp.SUM)
    work = comm.all_gather_single(torch.empty(2 * comm.get_size()), torch.ones(2), True)
    work.wait()
    if r == 0:
        comm.send(torch.ones(1), 1)
    elif r == 1:
        comm.recv(torch.empty(1), 0)
    full.close()
    brief.close()
    comm.barrier()  # not logged any more
    bad = _caught(clog, full_path, ["LIFECYCLE"], ["everything"])
    comm.finalize()
    with open(full_path) as f:
        full_lines = f.read().splitlines()
    with open(brief_path) as f:
        brief_lines = f.read().splitlines()
    return {"full": full_lines, "brief": brief_lines, "name": comm.get_name(), "bad": bad}


def test_clog_writes_the_reference_v1_format(pool2, tmp_path) -> None:
    for r, out in enumerate(pool2.run(body_clog, str(tmp_path))):
        name, p2p = out["name"], ("send" if r == 0 else "recv")
        full = out["full"]
        assert full[0].startswith("V|1|base_timestamp=")
        assert float(full[0].split("=")[1]) > 1.7e9  # epoch seconds
        assert full[1] == f"new_comm|comm={name}|rank={r}|world_size=2"
        peer_in, peer_out = (1, 0) if p2p == "send" else (0, 1)
        sigs = {line.split("|")[2]: line for line in full if "|sig|" in line}
        assert sigs["all_reduce"].startswith(
            "C1|sig|all_reduce|in_count=3|out_count=3|dtype=f32|red_op=sum|async_op=f|buf=0x"
        ) and sigs["all_reduce"].endswith(f"|comm={name}")
        assert sigs["all_gather_single"].startswith(
            "C2|sig|all_gather_single|in_count=2|out_count=4|dtype=f32|async_op=t|in=0x"
        )
        assert sigs[p2p].startswith(
            f"C3|sig|{p2p}|in_count={peer_in}|out_count={peer_out}|dtype=f32|peer={1 - r}"
            f"|async_op=f|"
        )
        events = [
            (row[0], row[1]) for row in (line.split("|") for line in full[2:]) if row[1] != "sig"
        ]
        assert events == [
            ("C1", "Q"),
            ("C1", "S"),
            ("C1", "E"),
            ("C2", "Q"),
            ("C2", "S"),
            ("C2", "E"),
            ("C2", "W"),
            ("C3", "Q"),
            ("C3", "S"),
            ("C3", "E"),
        ]
        queued = [line for line in full if "|Q|" in line]
        assert [q.split("|")[2] for q in queued] == ["work_id=1", "work_id=2", "work_id=3"]
        assert all(q.split("|")[3].startswith("+") for q in queued)
        # Without lifecycle events: the signatures and the enqueues only.
        brief = [line.split("|")[:2] for line in out["brief"][2:]]
        assert brief == [
            ["C1", "sig"],
            ["C1", "Q"],
            ["C2", "sig"],
            ["C2", "Q"],
            ["C3", "sig"],
            ["C3", "Q"],
        ]
        kind, message = out["bad"]
        assert kind == "CommInputError" and "'everything' is not understood" in message

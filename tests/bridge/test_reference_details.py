"""Details as the reference has them: flight-recorder fields, clog's file, DeviceMesh group
names, copies of communicators and reduce operators, ``RedOpType`` values."""

from __future__ import annotations

import copy
import json
import os

import torch

import torchcomms
from torchcomms.hooks import FlightRecorderHook, clog
from torchcomms_core.hooks.flight_recorder import ranks_str
from torchcomms_core.testing import unique_name


def _fake() -> torchcomms.TorchComm:
    return torchcomms.new_comm("fake", "cpu", name=unique_name("detail"), hints={"size": "4"})


def test_flight_recorder_duration_and_finalize_takes_no_id() -> None:
    comm = _fake()
    recorder = FlightRecorderHook(isolated=True).register_with_comm(comm)
    ids = []
    comm.register_pre_hook(lambda name, op_id, args: ids.append(op_id))
    comm.all_reduce(torch.ones(2), torchcomms.ReduceOp.SUM)
    comm.finalize()
    after = _fake()
    after.register_pre_hook(lambda name, op_id, args: ids.append(op_id))
    recorder.register_with_comm(after)
    after.barrier()
    after.finalize()
    # finalize's hooks see 2**64 - 1; the next operation takes the next id.
    assert ids == [0, 2**64 - 1, 1, 2**64 - 1]
    dump = json.loads(recorder.dump_json())
    entries = dump["entries"]
    # No finalize entry, and op_id counts the recorder's operations over both communicators.
    assert [e["profiling_name"] for e in entries] == ["fake:all_reduce", "fake:barrier"]
    assert [e["op_id"] for e in entries] == [1, 2]
    assert [e["collective_seq_id"] for e in entries] == [1, 1]  # per group, as c10d's
    assert entries[0]["state"] == "completed"
    assert isinstance(entries[0]["duration_ms"], float) and entries[0]["duration_ms"] >= 0
    assert dump["pg_config"][comm.get_name()]["ranks"] == "[0,1,2,3]"


def body_fr_pending_has_no_duration() -> list:
    comm = torchcomms.new_comm("gloo", "cpu", name=unique_name("fr-dur"))
    recorder = FlightRecorderHook(isolated=True).register_with_comm(comm)
    r = comm.get_rank()
    got = torch.empty(1)
    work = comm.recv(got, 1, async_op=True) if r == 0 else None
    pending = json.loads(recorder.dump_json())["entries"]
    comm.barrier()
    if r == 1:
        comm.send(torch.ones(1), 0)
    if work is not None:
        work.wait()
    done = json.loads(recorder.dump_json())["entries"]
    comm.finalize()
    return [[("duration_ms" in e, e["state"]) for e in x] for x in (pending, done)]


def test_duration_only_once_completed(pool2) -> None:
    first, _ = pool2.run(body_fr_pending_has_no_duration)
    pending, done = first
    assert pending == [(False, "started")]
    assert done[0] == (True, "completed") and all(has for has, _ in done)


def test_ranks_are_written_as_the_reference_writes_them() -> None:
    assert ranks_str([0, 1, 2]) == "[0,1,2]"
    assert ranks_str(range(2)) == "[0,1]"
    assert ranks_str([torch.tensor(3)]) == "[3]"
    assert ranks_str([]) == "[]"


def test_clog_writes_to_its_path_when_made(tmp_path) -> None:
    """The file is created (0600, truncated) with its header when the logger is made;
    one logger serves several communicators, and two loggers keep separate files."""
    path = tmp_path / "log" / "ops.clog"
    path.parent.mkdir()
    clog(str(path), [])
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"  # a file it creates
    path.write_text("stale\n")
    logger = clog(str(path), ["ALL"])
    assert path.read_text().startswith("V|1|base_timestamp=") and "stale" not in path.read_text()
    a, b, c = _fake(), _fake(), _fake()
    other = clog(str(tmp_path / "other.clog"), [])
    logger.register_with_comm(a).register_with_comm(b)
    other.register_with_comm(c)
    for comm in (a, b, c):
        comm.all_reduce(torch.ones(1), torchcomms.ReduceOp.SUM)
        comm.all_reduce(torch.ones(1), torchcomms.ReduceOp.SUM)  # the same signature
    text = path.read_text()
    for comm in (a, b):
        assert text.count(f"|comm={comm.get_name()}") == 2  # new_comm and one signature
    assert c.get_name() not in text
    assert f"|comm={c.get_name()}" in (tmp_path / "other.clog").read_text()
    assert text.count("|Q|work_id=") == 4
    try:
        logger.register_with_comm(a)
        raise AssertionError("registering twice must be refused")
    except torchcomms.CommInputError as exc:
        assert "already registered" in str(exc)
    for comm in (a, b, c):
        comm.finalize()
    logger.close()
    other.close()


def test_copies_of_communicators_and_reduce_ops() -> None:
    comm = _fake()
    assert copy.copy(comm) is comm and copy.deepcopy(comm) is comm
    memo: dict = {}
    holder = {"a": comm, "b": [comm]}
    copied = copy.deepcopy(holder, memo)
    assert copied["a"] is comm and copied["b"][0] is comm and memo[id(comm)] is comm
    stand_in = object()
    assert comm.__deepcopy__({id(comm): stand_in}) is stand_in  # memo honoured
    comm.finalize()

    op = torchcomms.ReduceOp.MAX
    dup = copy.copy(op)
    assert dup is not op and dup == op and dup.type is torchcomms.RedOpType.MAX
    factor = torch.tensor([0.5])
    premul = torchcomms.ReduceOp.PREMUL_SUM(factor)
    deep = copy.deepcopy(premul)
    assert deep is not premul and deep.type is torchcomms.RedOpType.PREMUL_SUM
    assert deep.factor is not factor and torch.equal(deep.factor, factor)
    # Copied together, operator and tensor keep sharing the factor (memo honoured).
    pair = copy.deepcopy((premul, factor))
    assert pair[0].factor is pair[1]
    assert copy.copy(premul).factor is factor


def test_red_op_type_values_are_the_references() -> None:
    values = {t.name: t.value for t in torchcomms.RedOpType}
    assert values == {
        "SUM": 0,
        "PRODUCT": 1,
        "MIN": 2,
        "MAX": 3,
        "BAND": 4,
        "BOR": 5,
        "BXOR": 6,
        "PREMUL_SUM": 7,
        "AVG": 8,
    }


def body_mesh_group_names() -> list:
    import torch.distributed as dist

    from torchcomms.device_mesh import init_device_mesh

    world = torchcomms.new_comm("gloo", "cpu", name=unique_name("mesh-world"))
    r, n = world.get_rank(), world.get_size()
    try:
        one = init_device_mesh((world,), ("dp",))
        names_1d = [one.get_group("dp").group_name, one.get_group("dp").group_desc]
        rows = world.split([k for k in range(n) if k // 2 == r // 2], "rows")
        cols = world.split([k for k in range(n) if k % 2 == r % 2], "cols")
        two = init_device_mesh((rows, cols), ("tp", "pp"), _global_comm=world)
        names_2d = [two.get_group(d).group_name for d in ("tp", "pp")]
        descs_2d = [two.get_group(d).group_desc for d in ("tp", "pp")]
        return [names_1d, names_2d, descs_2d]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for c in (locals().get("rows"), locals().get("cols"), world):
            if c is not None:
                c.finalize()


def test_device_mesh_groups_are_named_by_their_dimensions(pool4) -> None:
    for names_1d, names_2d, descs_2d in pool4.run(body_mesh_group_names):
        assert names_1d == ["dp", "dp"]
        assert names_2d == ["tp", "pp"] and descs_2d == ["tp", "pp"]


def test_the_reference_sheet_is_covered_names_and_hint_keys() -> None:
    """scripts/reference_api_check.py: every name and hint key of the sheet is found."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "reference_api_check.py")
    spec = importlib.util.spec_from_file_location("reference_api_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.check() + module.check_hints()
    assert any(label.startswith("torchcomms.distwrap.") for label, _, _ in rows)
    assert any(label.startswith("hint ") for label, _, _ in rows)
    off = [(label, status) for label, status, _ in rows if status != "same"]
    # torch itself has no ProcessGroupNCCL on a CPU build, so distwrap cannot re-export it.
    expected = (
        []
        if torch.distributed.is_nccl_available()
        else [("torchcomms.distwrap.ProcessGroupNCCL", "missing")]
    )
    assert off == expected


def test_the_reference_backend_modules_name_the_backend_classes() -> None:
    from torchcomms._comms_gloo import TorchCommGloo
    from torchcomms._comms_nccl import TorchCommNCCL
    from torchcomms._comms_ncclx import TorchCommNCCLX
    from torchcomms_core.plugin_host.backends import get_backend_class

    assert TorchCommGloo is get_backend_class("gloo")
    assert TorchCommNCCLX is get_backend_class("ncclx") and TorchCommNCCL is TorchCommNCCLX
    import torchcomms._comms_gloo as gloo_module

    try:
        gloo_module.TorchCommNCCLX  # noqa: B018
        raise AssertionError("an unknown name must raise")
    except AttributeError as exc:
        assert "TorchCommNCCLX" in str(exc)


def test_master_port_zero_serves_a_single_rank_and_is_refused_for_more(tmp_path) -> None:
    """The reference's test_factory: MASTER_PORT=0 under torchrun's agent store, 1 rank."""
    import subprocess
    import sys

    script = tmp_path / "factory.py"
    script.write_text(
        "import sys, torch, torchcomms\n"
        "from torchcomms._comms_gloo import TorchCommGloo\n"
        "c = torchcomms.new_comm('gloo', torch.device('cpu'), 'my_comm')\n"
        "assert isinstance(c.get_backend_impl(), TorchCommGloo)\n"
        "c.finalize()\n"
        "try:\n"
        "    torchcomms.new_comm('invalid', torch.device('cuda'), 'x')\n"
        "except ModuleNotFoundError as exc:\n"
        "    assert 'failed to find backend' in str(exc), exc\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHCOMM_", "MASTER_"))}
    env.update(
        MASTER_ADDR="localhost",
        MASTER_PORT="0",
        RANK="0",
        WORLD_SIZE="1",
        TORCHELASTIC_USE_AGENT_STORE="True",
    )
    one = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert one.returncode == 0 and one.stdout.strip() == "ok", one.stderr[-2000:]
    env.update(WORLD_SIZE="2")
    two = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert two.returncode != 0 and "MASTER_PORT=0 names no port" in two.stderr, two.stderr[-2000:]


def body_name_reused_after_finalize() -> list:
    """A finalized communicator gives its name back (the reference's test_copy makes
    one name per test); the new one starts clean (a fresh store namespace) and works.
    Deep copies of a module holding a communicator share it."""
    name = unique_name("again")
    seen = []
    for round_ in range(3):
        comm = torchcomms.new_comm("gloo", "cpu", name=name)
        t = torch.full((4,), float(comm.get_rank() + round_))
        comm.all_reduce(t, torchcomms.ReduceOp.SUM)
        holder = torch.nn.Module()
        holder.comm = comm  # type: ignore[assignment]
        copied = copy.deepcopy(holder)
        seen.append([t[0].item(), copied.comm is comm])
        if round_ == 1:
            comm.abort()  # aborted, it gives the name back too
        else:
            comm.finalize()
    return seen


def test_a_finalized_name_can_be_used_again(pool2) -> None:
    for seen in pool2.run(body_name_reused_after_finalize):
        assert seen == [[1.0, True], [3.0, True], [5.0, True]]


class _Loopback(torchcomms.TorchCommBackend):
    """A one-rank Python backend, as the reference's tests write them: sends to itself
    are queued and received in order; its works have wait() only."""

    def init(self, device, name, options):  # type: ignore[no-untyped-def]
        self._name, self._queue, self.waited = name, [], 0

    def finalize(self) -> None:
        pass

    def get_rank(self) -> int:
        return 0

    def get_size(self) -> int:
        return 1

    def get_backend_name(self) -> str:
        return "loopback"

    def get_comm_name(self) -> str:
        return self._name

    def send(self, tensor, dst, async_op, **kw):  # type: ignore[no-untyped-def]
        self._queue.append(tensor.clone())

    def recv(self, tensor, src, async_op, **kw):  # type: ignore[no-untyped-def]
        backend = self

        class Work:
            def wait(self) -> None:
                backend.waited += 1
                tensor.copy_(backend._queue.pop(0))

        return Work()


def test_python_backends_send_to_themselves_and_works_complete_when_waited(monkeypatch) -> None:
    from torch.distributed import HashStore

    monkeypatch.setenv("TORCHCOMM_RANK", "0")
    monkeypatch.setenv("TORCHCOMM_SIZE", "1")
    torchcomms.register_backend("loopback_test", _Loopback)
    try:
        comm = torchcomms.new_comm(
            "loopback_test", "cpu", name=unique_name("loop"), store=HashStore()
        )
        comm.send(torch.arange(3.0), 0)
        comm.send(torch.arange(3.0) + 10, 0)
        got = torch.zeros(3)
        work = comm.recv(got, 0, async_op=True)
        # A work without is_completed() cannot say it finished: not until waited.
        assert not work.is_completed() and comm.get_backend_impl().waited == 0
        work.wait()
        assert work.is_completed() and got.tolist() == [0.0, 1.0, 2.0]
        comm.recv(got, 0)
        assert got.tolist() == [10.0, 11.0, 12.0]
        comm.finalize()
        # Engines that cannot pair a rank with itself keep refusing, clearly.
        from torchcomms_gloo import GlooBackend

        assert GlooBackend.allows_self_p2p is False and _Loopback.allows_self_p2p is True
    finally:
        torchcomms.unregister_backend("loopback_test")

"""torchft's own test cases over our communicators (gloo, cpu), one scenario per process.

``python tests/fault_tolerance/torchft_scenarios.py NAME`` runs one scenario and prints one
JSON line (``RESULT {...}``) that ``test_torchft.py`` checks. The scenarios use torchft's Manager,
lighthouse, DDP and optimizer wrappers, LocalSGD, DiLoCo and the helpers of its integration
tests (``Runner``, ``EventInjector``, ``MyModel``, ``DiLoCoTrainer``) as torchft's tests do,
with ``ProcessGroupTorchComms`` over ``new_comm("gloo", "cpu", enable_reconfigure=True)``
where torchft's tests create an ``mccl`` communicator on CUDA.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

import torch
from torch import nn, optim

import torchcomms

# torchft's integration tests ask for this (its torchcomms cases set it the same way).
os.environ.setdefault("TORCHCOMM_RANK", "0")
os.environ.setdefault("TORCHCOMM_SIZE", "1")

INIT_LOCK = threading.Lock()
TIMEOUT = timedelta(seconds=20)


def _comm(name: str) -> Any:
    return torchcomms.new_comm(
        "gloo", torch.device("cpu"), name=name, enable_reconfigure=True, timeout=TIMEOUT
    )


def _pg(name: str) -> Any:
    from torchft.torchcomms import ProcessGroupTorchComms

    return ProcessGroupTorchComms(comm=_comm(name), timeout=TIMEOUT)


def _same(state_dicts: list[Any], key: str | None = None) -> bool:
    first = state_dicts[0] if key is None else state_dicts[0][key]
    for sd in state_dicts[1:]:
        torch.testing.assert_close(sd if key is None else sd[key], first, check_device=False)
    return True


# -- torchcomms_test.py: the API cases, on gloo instead of mccl --------------------------------


def api() -> dict[str, Any]:
    """torchft's ``ProcessGroupTorchCommsMcclTest`` cases: collectives, reconfigure twice,
    shutdown, abort, DDP forward/backward; plus every collective at 2 ranks (threads)."""
    from torch._C import _distributed_c10d as c10d
    from torch.distributed import TCPStore
    from torchft.process_group import reconfigure_with_store
    from torchft.torchcomms_test import _dummy_init_pg, _test_torchcomms_pg

    _dummy_init_pg()
    store = TCPStore(host_name="localhost", port=0, is_master=True, wait_for_workers=False)
    out: dict[str, Any] = {}

    pg = _pg("api0")
    reconfigure_with_store(pg, f"localhost:{store.port}/apis", 0, 1)
    out["backend"] = pg.getBackendName()
    out["collectives"] = sorted(_test_torchcomms_pg(pg, torch.tensor([2], dtype=torch.float32)))

    pg = _pg("api1")
    values = []
    for i in (1, 2):
        reconfigure_with_store(pg, f"localhost:{store.port}/prefix{i}", 0, 1)
        t = torch.tensor([float(i)])
        pg.allreduce([t], torch.distributed.ReduceOp.SUM).wait()
        values.append((pg.size(), t.item()))
    out["reconfigure_twice"] = values

    for what in ("shutdown", "abort"):
        pg = _pg(f"api-{what}")
        reconfigure_with_store(pg, f"localhost:{store.port}/{what}", 0, 1)
        getattr(pg, what)()
        out[what] = pg._comm is None

    pg = _pg("api-ddp")
    reconfigure_with_store(pg, f"localhost:{store.port}/ddp", 0, 1)
    m = torch.nn.parallel.DistributedDataParallel(nn.Linear(3, 4), process_group=pg)
    m(torch.rand(2, 3)).sum().backward()
    out["ddp_grads"] = all(p.grad is not None for p in m.parameters())

    # Two members (threads of this process, one communicator each, the same name): every
    # collective of ProcessGroupTorchComms, with the values checked.
    def member(rank: int) -> dict[str, Any]:
        pg = _pg("api2")
        reconfigure_with_store(pg, f"localhost:{store.port}/two", rank, 2)
        got: dict[str, Any] = {"size": pg.size()}
        t = torch.tensor([rank + 1.0])
        pg.allreduce([t], torch.distributed.ReduceOp.SUM).wait()
        got["allreduce"] = t.item()
        outs = [[torch.zeros(1), torch.zeros(1)]]
        pg.allgather(outs, [torch.tensor([rank + 10.0])], c10d.AllgatherOptions()).wait()
        got["allgather"] = [x.item() for x in outs[0]]
        b = torch.tensor([rank + 5.0])
        opts = c10d.BroadcastOptions()
        opts.rootRank = 1
        pg.broadcast([b], opts).wait()
        got["broadcast"] = b.item()
        rs = torch.zeros(1)
        pg.reduce_scatter(
            [rs], [[torch.tensor([1.0]), torch.tensor([2.0])]], c10d.ReduceScatterOptions()
        ).wait()
        got["reduce_scatter"] = rs.item()
        a2a = torch.zeros(2)
        pg.alltoall_base(
            a2a,
            torch.tensor([rank * 2.0, rank * 2.0 + 1]),
            [1, 1],
            [1, 1],
            c10d.AllToAllOptions(),
        ).wait()
        got["alltoall"] = a2a.tolist()
        peer = 1 - rank
        if rank == 0:
            pg.send([torch.tensor([42.0])], peer, 0).wait()
        else:
            r = torch.zeros(1)
            pg.recv([r], peer, 0).wait()
            got["recv"] = r.item()
        pg.barrier().wait()
        pg.shutdown()
        return got

    with ThreadPoolExecutor(2) as ex:
        out["two_ranks"] = list(ex.map(member, range(2)))
    return out


# -- manager_integ_test.py: DDP under the Manager, replica groups as threads -------------------


def ddp_train_loop(
    rank: int,
    store_port: int,
    device: torch.device,
    runner: Any,
    train_loop_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """torchft's ``ddp_train_loop_torchcomms`` with backend ``gloo`` on ``cpu``."""
    from torchft.ddp import DistributedDataParallel
    from torchft.manager import Manager
    from torchft.manager_integ_test import MyModel
    from torchft.optim import OptimizerWrapper

    with ExitStack() as stack:

        def load_state_dict(state_dict: dict[str, Any]) -> None:
            m.load_state_dict(state_dict["model"])
            optimizer.load_state_dict(state_dict["optim"])

        def state_dict() -> dict[str, Any]:
            return {"model": m.state_dict(), "optim": optimizer.state_dict()}

        pg = _pg(f"ft{rank}")
        manager = Manager(
            pg=pg,
            min_replica_size=2,
            load_state_dict=load_state_dict,
            state_dict=state_dict,
            replica_id=str(runner.replica_id),
            store_addr="localhost",
            store_port=store_port,
            rank=rank,
            world_size=runner.world_size,
            lighthouse_addr=runner.lighthouse_address,
            port=19530 + runner.replica_id,
            timeout=TIMEOUT,
            **runner.manager_args,
        )
        stack.callback(lambda: manager.shutdown(wait=False))
        with INIT_LOCK:
            torch.manual_seed(42)
            m: nn.Module = MyModel()
        m = DistributedDataParallel(manager, m)
        optimizer: optim.Optimizer = OptimizerWrapper(manager, optim.Adam(m.parameters()))
        criterion = nn.CrossEntropyLoss()
        while True:
            inputs = torch.rand(2, 3)
            labels = torch.randint(4, (2,))
            optimizer.zero_grad()
            loss = criterion(m(inputs), labels)
            loss.backward()
            optimizer.step()
            if manager.current_step() >= 4:
                break
            runner.event_injector.check(rank, manager.current_step())
        return state_dict()


def _replicas(train_loop: Any, injectors: list[Any], **runner_args: Any) -> list[Any]:
    from torchft._torchft import LighthouseServer
    from torchft.manager_integ_test import Runner

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2)
    results: list[Any] = []
    try:
        with ThreadPoolExecutor(max_workers=len(injectors)) as executor:
            futures = [
                executor.submit(
                    Runner(
                        replica_id=replica_id,
                        num_replicas=len(injectors),
                        lighthouse_address=lighthouse.address(),
                        event_injector=injector,
                        train_loop=train_loop,
                        **runner_args,
                    ).run_replica
                )
                for replica_id, injector in enumerate(injectors)
            ]
            for fut in as_completed(futures):
                fut.result()  # the first failure, as soon as it happens
            results = [fut.result() for fut in futures]  # in replica order
    finally:
        lighthouse.shutdown()
    return results


def _failures(injector: Any) -> int:
    from torchft.manager_integ_test import EventInjectorEvent

    return int(injector.count[EventInjectorEvent.Failure])


def ddp_healthy() -> dict[str, Any]:
    """``test_ddp_healthy_torchcomms``: two replica groups, equal final state dicts."""
    from torchft.manager_integ_test import EventInjector

    state_dicts = _replicas(ddp_train_loop, [EventInjector(), EventInjector()])
    return {"replicas": len(state_dicts), "equal": _same(state_dicts)}


def ddp_recovery() -> dict[str, Any]:
    """``test_ddp_recovery_torchcomms``: replica 1 fails at step 2 and rejoins."""
    from torchft.manager_integ_test import EventInjector

    injectors = [EventInjector(), EventInjector().fail_at(0, 2)]
    state_dicts = _replicas(ddp_train_loop, injectors)
    return {
        "replicas": len(state_dicts),
        "equal": _same(state_dicts),
        "failures": _failures(injectors[1]),
    }


# -- local_sgd_integ_test.py: LocalSGD and DiLoCo over ProcessGroupTorchComms ------------------


def local_sgd_train_loop(
    rank: int,
    store_port: int,
    device: torch.device,
    runner: Any,
    train_loop_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """torchft's ``local_sgd_train_loop`` over ``ProcessGroupTorchComms`` (gloo)."""
    from torchft.local_sgd import LocalSGD
    from torchft.manager import Manager
    from torchft.manager_integ_test import MyModel

    with ExitStack() as stack:

        def load_state_dict(state_dict: dict[str, Any]) -> None:
            m.load_state_dict(state_dict["model"])
            optimizer.load_state_dict(state_dict["optim"])

        def state_dict() -> dict[str, Any]:
            return {"model": m.state_dict(), "optim": optimizer.state_dict()}

        manager = Manager(
            pg=_pg(f"ft{rank}"),
            min_replica_size=2,
            load_state_dict=load_state_dict,
            state_dict=state_dict,
            replica_id=str(runner.replica_id),
            store_addr="localhost",
            store_port=store_port,
            rank=rank,
            world_size=runner.world_size,
            lighthouse_addr=runner.lighthouse_address,
            port=19530 + runner.replica_id,
            timeout=TIMEOUT,
            **runner.manager_args,
        )
        stack.callback(lambda: manager.shutdown(wait=False))
        m: nn.Module = MyModel()
        optimizer: optim.Optimizer = optim.Adam(m.parameters())
        criterion = nn.CrossEntropyLoss()
        with LocalSGD(manager, m, optimizer, sync_every=2):
            while True:
                inputs = torch.rand(2, 3)
                labels = torch.randint(4, (2,))
                optimizer.zero_grad()
                criterion(m(inputs), labels).backward()
                optimizer.step()
                if manager.current_step() >= 4:
                    break
                runner.event_injector.check(rank, manager.current_step())
        return state_dict()


def local_sgd_recovery() -> dict[str, Any]:
    """``test_local_sgd_recovery``: the models agree after replica 1 failed at step 2."""
    from torchft.manager_integ_test import EventInjector

    injectors = [EventInjector(), EventInjector().fail_at(0, 2)]
    results = _replicas(local_sgd_train_loop, injectors, manager_args={"use_async_quorum": False})
    models = [r[0]["model"] for r in results]
    return {"replicas": len(results), "equal": _same(models), "failures": _failures(injectors[1])}


def _diloco_loop(
    rank: int,
    store_port: int,
    device: torch.device,
    runner: Any,
    train_loop_args: dict[str, Any] | None = None,
) -> Any:
    """torchft's ``diloco_train_loop`` with its trainer's process group replaced by ours."""
    from torchft._test.diloco_trainer import DiLoCoTrainer

    class TorchCommsDiLoCoTrainer(DiLoCoTrainer):
        def setup_pg(self) -> Any:  # torchft's test wraps ProcessGroupGloo here
            return _pg(f"ft{self.rank}")

    args = train_loop_args or {}
    with ExitStack() as stack:
        trainer = TorchCommsDiLoCoTrainer(
            rank, store_port, device, runner, args["model_state_dict"], 1, {}
        )
        stack.callback(trainer.manager.shutdown)
        return trainer.train_loop()


def _diloco(fail: bool) -> dict[str, Any]:
    from torchft._test.diloco_trainer import MultiMyModel
    from torchft.local_sgd_integ_test import assert_equal_global_state
    from torchft.manager_integ_test import EventInjector

    torch.manual_seed(42)
    m = MultiMyModel(2, 3, 1)
    injectors = [EventInjector(), EventInjector().fail_at(0, 2) if fail else EventInjector()]
    results = _replicas(
        _diloco_loop, injectors, train_loop_args={"model_state_dict": m.state_dict()}
    )
    rep0, rep1 = (r[0] for r in results)
    assert_equal_global_state(1, rep1, rep0)
    return {
        "replicas": len(results),
        "steps": sorted(int(s) for s in rep0),
        "equal": True,
        "failures": _failures(injectors[1]),
    }


def diloco_healthy() -> dict[str, Any]:
    """``test_diloco_healthy``: equal global state (original parameters, outer optimizer)."""
    return _diloco(fail=False)


def diloco_recovery() -> dict[str, Any]:
    """``test_diloco_recovery``: replica 1 fails at step 2; the global state still agrees."""
    return _diloco(fail=True)


SCENARIOS = {
    f.__name__: f
    for f in (api, ddp_healthy, ddp_recovery, local_sgd_recovery, diloco_healthy, diloco_recovery)
}

if __name__ == "__main__":
    result = SCENARIOS[sys.argv[1]]()
    print("RESULT " + json.dumps(result), flush=True)
    # Manager threads and lighthouse connections may linger; the result is out.
    os._exit(0)

"""``torchcomms.objcol``: object collectives, safe to deserialise unless pickle is opted into.

The malicious object's ``__reduce__`` would create a marker file when unpickled; by
default it must be refused with no file created, and with the opt-in it is accepted.
"""

from __future__ import annotations

import os
from collections import OrderedDict

import pytest
import torch

import torchcomms
from torchcomms import objcol
from torchcomms_core.testing import unique_name


def _comm():
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("obj"))


def create_marker(path: str) -> str:
    with open(path, "w") as f:
        f.write("code ran")
    return "pwned"


class Malicious:
    """Unpickling this calls ``create_marker``: what a hostile peer would send."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (create_marker, (self.path,))


def body_every_collective() -> dict:
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    res: dict = {}
    mine = {"rank": r, "t": torch.arange(r + 1), "nested": [r, ("x" * r, 1.5)]}
    everyone = [None] * n
    objcol.all_gather_object(comm, everyone, mine)
    res["all_gather"] = [(o["rank"], o["t"].tolist(), o["nested"]) for o in everyone]
    gathered = [None] * n if r == 1 else None
    objcol.gather_object(comm, OrderedDict(r=r), 1, gathered)
    res["gather"] = [dict(o) for o in gathered] if gathered else None
    lst = [{"a": 1}, "text", torch.ones(2)] if r == 0 else [None, None, None]
    objcol.broadcast_object_list(comm, lst, root=0)
    res["broadcast"] = [lst[0], lst[1], lst[2].tolist()]
    out = [None]
    objcol.scatter_object_list(
        comm, n - 1, out, [f"for {k}" * (k + 1) for k in range(n)] if r == n - 1 else None
    )
    res["scatter"] = out[0]
    if r == 0:
        objcol.send_object_list(comm, [{"k": 1}, [2, 3]], 1)
        res["p2p"] = None
    elif r == 1:
        got = [None, None]
        objcol.recv_object_list(comm, got, 0)
        res["p2p"] = got
    comm.finalize()
    return res


def test_object_collectives_deliver_every_object(pool) -> None:
    n = pool.world_size
    res = pool.run(body_every_collective)
    for r, out in enumerate(res):
        assert out["all_gather"] == [(k, list(range(k + 1)), [k, ("x" * k, 1.5)]) for k in range(n)]
        assert out["broadcast"] == [{"a": 1}, "text", [1.0, 1.0]]
        assert out["scatter"] == f"for {r}" * (r + 1)
    assert res[1]["gather"] == [{"r": k} for k in range(n)]
    assert res[0]["gather"] is None
    assert res[1]["p2p"] == [{"k": 1}, [2, 3]]


def body_malicious(marker_dir: str, opt_in: str) -> tuple:
    if opt_in == "env":
        os.environ["TORCHCOMMS_SERIALIZATION"] = "pickle"
    try:
        comm = _comm()
        r = comm.get_rank()
        marker = os.path.join(marker_dir, "marker")
        lst = [Malicious(marker)] if r == 0 else [None]
        try:
            objcol.broadcast_object_list(
                comm, lst, root=0, weights_only=False if opt_in == "arg" else None
            )
        except objcol.UnsafeObjectError as exc:
            outcome = f"refused: {exc}"
        else:
            outcome = f"accepted: {lst[0]!r}"
        comm.finalize()
        return outcome, os.path.exists(marker)
    finally:
        os.environ.pop("TORCHCOMMS_SERIALIZATION", None)


def test_a_malicious_object_is_refused_by_default_and_runs_nothing(pool2, tmp_path) -> None:
    (root, _), (outcome, ran) = pool2.run(body_malicious, str(tmp_path), "")
    assert outcome.startswith("refused") and "rank 0" in outcome
    assert "TORCHCOMMS_SERIALIZATION=pickle" in outcome
    assert not ran and not os.listdir(tmp_path)


@pytest.mark.parametrize("opt_in", ["env", "arg"])
def test_a_malicious_object_runs_only_with_the_pickle_opt_in(pool2, tmp_path, opt_in) -> None:
    _, (outcome, ran) = pool2.run(body_malicious, str(tmp_path), opt_in)
    assert outcome == "accepted: 'pwned'"
    assert ran


def body_refused_in_all_gather() -> str:
    comm = _comm()
    out = [None] * comm.get_size()
    try:
        objcol.all_gather_object(comm, out, Malicious("/nonexistent/never"))
    except objcol.UnsafeObjectError as exc:
        msg = str(exc)
    comm.finalize()
    return msg


def test_every_receiving_collective_refuses_unsafe_objects(pool2) -> None:
    for msg in pool2.run(body_refused_in_all_gather):
        assert "refused the object from rank 0" in msg


def body_bad_list() -> str:
    comm = _comm()
    try:
        objcol.all_gather_object(comm, [None], 1)
    except ValueError as exc:
        msg = str(exc)
    comm.finalize()
    return msg


def test_wrong_list_length_says_what_to_pass(pool2) -> None:
    assert "one per rank (2)" in pool2.run(body_bad_list)[0]


def test_bad_serialization_setting_is_explained(monkeypatch) -> None:
    from torchcomms_core.foundation import env as _env

    monkeypatch.setenv("TORCHCOMMS_SERIALIZATION", "yaml")
    with pytest.raises(ValueError, match="set it to 'pickle'"):
        _env.serialization_allows_pickle()

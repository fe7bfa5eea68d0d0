"""The conformance suite catches broken backends, fast, and says what is wrong.

Each broken backend is a fake installed distribution (dist-info and module on a temporary
path, as in test_misbehaving_plugins.py) that the suite is run against exactly as a
vendor runs it: ``pytest --pyargs torchcomms_core.testing --torchcomms-backend NAME``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_misbehaving_plugins import fake_dist

from torchcomms_core.testing import conformance_env, run_conformance

BROKEN = '''
from datetime import timedelta

from torchcomms_gloo import GlooBackend
from torchcomms_core.plugin import TorchCommBackend

#: What a kernel socket buffers: a send of more blocks until the peer reads.
SOCKET_BUFFER = 4 << 20


class BlockingSendGloo(GlooBackend):
    """gloo whose send, like a plain socket write, returns at once for small messages but
    blocks until the peer receives for large ones, even with async_op=True."""

    def send(self, tensor, dst, async_op, *, timeout=None, hints=None):
        work = super().send(tensor, dst, True, timeout=timeout, hints=hints)
        if tensor.numel() * tensor.element_size() > SOCKET_BUFFER:
            work.wait()
            return None
        return work if async_op else work.wait() and None


class DeafRecvGloo(GlooBackend):
    """gloo whose recv ignores the timeout it is given."""

    def recv(self, tensor, src, async_op, *, timeout=None, hints=None):
        return super().recv(tensor, src, async_op, timeout=timedelta(hours=1), hints=hints)


class NamelessBackend(TorchCommBackend):
    """No get_comm_name, and a send that lacks async_op."""

    def init(self, device, name, options):
        self.rank, self.size = options.rank, options.size

    def finalize(self):
        pass

    def get_rank(self):
        return self.rank

    def get_size(self):
        return self.size

    def get_backend_name(self):
        return "nameless"

    def send(self, tensor, dst):
        pass

    def recv(self, tensor, src, async_op, *, timeout=None, hints=None):
        pass


class PipesBackend(GlooBackend):
    """Fine, but the entry point misspells its name."""
'''

ENTRY_POINTS = "\n".join(
    [
        "blocksend = tc_broken:BlockingSendGloo",
        "deafrecv = tc_broken:DeafRecvGloo",
        "nameless = tc_broken:NamelessBackend",
        "pipes = tc_broken:PipesBakend",
        "pipez = tc_brokn:PipesBackend",
    ]
)


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("broken")
    fake_dist(root, "tc-broken", "0.1", "torchcomms.backends", ENTRY_POINTS, "tc_broken", BROKEN)
    return root


def _env(root: Path) -> dict[str, str]:
    return conformance_env(pythonpath=[root])


def _conformance(root: Path, backend: str, *extra: str) -> tuple[str, float]:
    """Run the suite against ``backend``; return its output and how long it took."""
    start = time.monotonic()
    res = run_conformance(backend, 2, extra_args=extra, pythonpath=[root])
    took = time.monotonic() - start
    assert res.returncode == 1, res.stdout[-4000:] + res.stderr[-2000:]
    return res.stdout, took


def _failed(out: str) -> list[str]:
    """The names of the tests the run reports as failed."""
    return [
        line.split("::", 1)[1].split(" ", 1)[0]
        for line in out.splitlines()
        if line.startswith("FAILED ") and "::" in line
    ]


def test_a_send_that_blocks_on_the_peer_fails_fast_naming_the_rule(broken: Path) -> None:
    out, took = _conformance(broken, "blocksend", "--torchcomms-timeout", "30")
    print(f"blocking send caught in {took:.1f} s")
    # Small messages pass; the first contract that sends 16 MiB catches it and stops.
    assert _failed(out) == ["test_async_send_returns_before_the_peer_receives"], out[-3000:]
    assert "1 failed, 1 passed" in out, out[-3000:]
    assert "must not block on the peer" in out and "did not return within 10 s" in out
    assert "later contracts were not run" in out
    # Rank 0's stack shows where it is stuck: in the backend's send.
    stuck = out[out.index("--- rank 0") :]
    assert "tc_broken.py" in stuck and " in send" in stuck, stuck[:2000]
    assert took < 180, f"took {took:.0f} s"


def test_a_recv_that_ignores_its_timeout_fails_fast_naming_the_rule(broken: Path) -> None:
    out, took = _conformance(
        broken,
        "deafrecv",
        "--torchcomms-timeout",
        "10",
        "-k",
        "resolves or unanswered or bad_input",
    )
    print(f"deaf recv caught in {took:.1f} s")
    assert _failed(out) == ["test_unanswered_receive_times_out"], out[-3000:]
    assert "must raise CommTimeoutError within its own timeout" in out
    assert "does not honour the timeout it is given" in out
    # The contract ran out of --torchcomms-timeout (10 s, not a hard-coded 60 s) and
    # stopped the run: the bad-input contract after it did not run.
    assert "(--torchcomms-timeout 10 s); later contracts were not run" in out
    assert "1 failed, 1 passed" in out, out[-3000:]
    assert " in wait" in out[out.index("--- rank 0") :]
    assert took < 90, f"took {took:.0f} s"


def test_a_backend_missing_a_method_fails_at_load_naming_it(broken: Path) -> None:
    out, took = _conformance(broken, "nameless")
    assert _failed(out) == ["test_backend_resolves_and_can_run_here"], out[-3000:]
    assert "1 failed in" in out  # the run stopped: nothing else ran
    assert "backend 'nameless' cannot be loaded: backend 'nameless' from tc-broken 0.1" in out
    assert "missing required method(s) get_comm_name" in out
    assert "send(self, tensor, dst) cannot be called as the core calls it" in out
    assert "send(self, tensor: torch.Tensor, dst: int, async_op: bool" in out
    assert took < 60, f"took {took:.0f} s"


PROBE = """
import json, torchcomms
from torchcomms_core.cli import main
out = {}
for name in ("nameless", "pipes", "pipez"):
    try:
        torchcomms.new_comm(name, "cpu", name="never")
    except torchcomms.TorchCommError as exc:
        out[name] = [type(exc).__name__, str(exc)]
from torchcomms_core.spec import method_support
import tc_broken
out["support"] = method_support(tc_broken.NamelessBackend)["get_comm_name"]
print(json.dumps(out))
main(["backends"])
"""


def test_load_errors_name_the_problem_and_the_fix(broken: Path) -> None:
    import json

    res = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(broken),
        cwd="/",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    first, table = res.stdout.split("\n", 1)
    errors = json.loads(first)
    kind, message = errors["nameless"]
    assert kind == "BackendLoadError"
    assert "tc_broken.NamelessBackend does not meet the backend spec" in message
    assert "missing required method(s) get_comm_name: implement get_comm_name(self)" in message
    assert errors["support"] == "missing"
    section = '[project.entry-points."torchcomms.backends"] section'
    kind, message = errors["pipes"]
    assert kind == "BackendLoadError"
    assert "entry point 'tc_broken:PipesBakend' names 'PipesBakend'" in message
    assert "module 'tc_broken' does not define" in message
    assert section in message and "pyproject.toml" in message
    assert "force-reinstall" not in message
    kind, message = errors["pipez"]
    assert "names module 'tc_brokn', which does not exist" in message and section in message
    # `torchcomms backends` lists all three as broken, with the same reasons.
    for name in ("nameless", "pipes", "pipez"):
        row = next(line for line in table.splitlines() if line.startswith(f"{name} "))
        assert "BROKEN" in row, row
    assert "broken: nameless: failed to load:" in table
    assert "missing required method(s) get_comm_name" in table
    assert "broken: pipes: failed to load:" in table and "PipesBakend" in table

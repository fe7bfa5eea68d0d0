#!/usr/bin/env python3
"""Run PyTorch's own distributed test files with the c10d bridge's switch off and on.

PyTorch's test files are not in the wheel (its ``torch.testing._internal`` helpers are):
point the script at a PyTorch source tree, or at a cache of the files taken one by one
from PyTorch's repository at the wheel's commit (``torch.version.git_version``) or the
nearest one whose files import against the wheel, laid out as in the repository
(``<root>/test/distributed/test_device_mesh.py``, ...)::

    python scripts/torch_dist_files.py --pytorch /path/to/pytorch          # every file
    TORCHCOMMS_PYTORCH_TESTS=/path/to/pytorch python scripts/torch_dist_files.py
    python scripts/torch_dist_files.py --pytorch DIR --files device_mesh -k test_from_group
    python scripts/torch_dist_files.py --pytorch DIR --files dtensor --world-size 2
    python scripts/torch_dist_files.py --list                              # the files

Each file runs twice under pytest, in its own directory (files import their siblings):
plainly and with ``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1``. With ``--clean-python PYTHON``
(an environment with the same torch and none of our distributions, e.g. a venv made with
``pip install torch==<version> pytest expecttest numpy``) it runs a third time there, switch
off, and fails when a test passes with torch alone and not with our distributions
installed: installed and not used must change nothing. The script prints, per file,
the counts of both runs and every test that passes plainly and fails under the switch;
it exits 1 when there is one (a gate), 0 otherwise. Without a PyTorch tree it says so and
exits 0 ("skipped: ..."), so a machine without one passes.

Every process of a run loads ``tests/bridge/torch_suite/site/torch_files_hooks.py``:
errors ``MultiThreadedTestCase`` would swallow (its ``init_process_group`` runs outside
the ``try`` that reports a rank's errors) fail the test instead of letting it pass
without having run, and ``--world-size`` sets the size of the tests that take the
framework's default. These runs are CPU heavy: run one file at a time on a shared
machine, and prefer ``-k`` while iterating.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "tests" / "bridge" / "torch_suite" / "site"
ENV_TREE = "TORCHCOMMS_PYTORCH_TESTS"


@dataclasses.dataclass(frozen=True)
class TestFile:
    """One of PyTorch's test files, and which of its tests to run on a CPU machine."""

    name: str
    path: str
    select: str | None = None
    why: str = ""


# The files the bridge is checked against (issue #34). ``select`` keeps to the classes
# that run on CPU/gloo where a file also holds CUDA-only or unrelated ones.
FILES: tuple[TestFile, ...] = (
    TestFile("device_mesh", "test/distributed/test_device_mesh.py"),
    TestFile("functional_api", "test/distributed/test_functional_api.py"),
    TestFile("dtensor", "test/distributed/tensor/test_dtensor.py"),
    TestFile("object_collectives", "test/distributed/test_c10d_object_collectives.py"),
    TestFile(
        "c10d_gloo",
        "test/distributed/test_c10d_gloo.py",
        "RendezvousEnvTest or TimeoutTest or (ProcessGroupGlooTest and "
        "(coalesced_async or into_tensor_coalesced or reduce_scatter or cuda_dispatched)) "
        "or DistributedDataParallelTest or ReducerTest or CommTest "
        "or GlooProcessGroupWithDispatchedCollectivesTests",
        "the tests that create their groups with init_process_group (the rest of "
        "ProcessGroupGlooTest builds ProcessGroupGloo directly, which the switch never sees)",
    ),
    TestFile(
        "c10d_common",
        "test/distributed/test_c10d_common.py",
        "PythonProcessGroupExtensionTest or ProcessGroupWithDispatchedCollectivesTests or CommTest",
        "the classes that create their groups with init_process_group",
    ),
    TestFile("replicate", "test/distributed/_composable/test_replicate.py"),
    TestFile("dcp_fs_cpu", "test/distributed/checkpoint/test_file_system_checkpoint_cpu.py"),
    # FSDP2 on CPU: the threaded-rank tests run; the others skip without GPUs.
    TestFile("fsdp2_init", "test/distributed/_composable/fsdp/test_fully_shard_init.py"),
)

_OUTCOME = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_SECTION = re.compile(r"^_+ (?:ERROR at \w+ of )?(\S+?) _+$")

# Failures raised inside PyTorch's own switch path, before any torchcomms code runs
# (docs/pytorch-integration.md, "Raised inside PyTorch's switch path"): a test that
# fails with one of these is reported as PyTorch's, not as a regression of the bridge.
TORCH_OWN: dict[str, str] = {
    "new_group cannot delegate to split_group": (
        "PyTorch's switch refuses new_group(use_local_synchronization=True)"
    ),
    '"::c10d::Store::clone"': "PyTorch's switch splits a fake group whose store cannot clone",
}


def tree_from(arg: str | None) -> tuple[Path | None, str]:
    """The PyTorch tree to use, or ``None`` and why there is none."""
    given = arg or os.environ.get(ENV_TREE)
    if not given:
        return None, (
            f"no PyTorch checkout given (pass --pytorch DIR or set {ENV_TREE}); PyTorch's "
            f"test files are not part of the wheel"
        )
    tree = Path(given).expanduser()
    if not (tree / "test" / "distributed").is_dir():
        return None, f"{tree} holds no test/distributed folder (a PyTorch checkout's root?)"
    return tree, ""


def run_file(
    tree: Path,
    entry: TestFile,
    switched: bool,
    select: str | None,
    timeout: float,
    world_size: int | None,
    log: Path | None,
    python: str = sys.executable,
) -> tuple[dict[str, str], float, str, dict[str, str]]:
    """Run one file with ``python``: each test's outcome, the seconds taken, a note (timed
    out...), and the failures that show one of PyTorch's own switch errors
    (``torch_own``)."""
    path = tree / entry.path
    env = dict(os.environ)
    env["TORCHCOMMS_TORCH_FILES_HOOKS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SITE), str(path.parent), env.get("PYTHONPATH", "")) if p
    )
    if world_size:
        env["TORCHCOMMS_TORCH_FILES_WORLD_SIZE"] = str(world_size)
    else:
        env.pop("TORCHCOMMS_TORCH_FILES_WORLD_SIZE", None)
    if switched:
        env["TORCH_DISTRIBUTED_USE_TORCHCOMMS"] = "1"
    else:
        env.pop("TORCH_DISTRIBUTED_USE_TORCHCOMMS", None)
    cmd = [python, "-m", "pytest", "-v", "-p", "no:cacheprovider", path.name]
    chosen = select if select is not None else entry.select
    if chosen:
        cmd += ["-k", chosen]
    start = time.monotonic()
    note = ""
    # pytest writes straight into the log (or a scratch file), so a long run can be
    # followed with ``tail -f`` and what it printed survives a kill. Its own session, so
    # that a run past the timeout is ended with the ranks it spawned.
    with tempfile.TemporaryFile("w+") if log is None else log.open("w+") as sink:
        proc = subprocess.Popen(
            cmd,
            cwd=path.parent,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout)
            if proc.returncode not in (0, 1, 5):
                note = f"pytest exited {proc.returncode}"
        except subprocess.TimeoutExpired:
            _kill_session(proc.pid)
            proc.wait()
            note = f"timed out after {timeout:.0f} s (outcomes so far kept)"
        sink.seek(0)
        out = sink.read()
    elapsed = time.monotonic() - start
    outcomes: dict[str, str] = {}
    for line in out.splitlines():
        m = _OUTCOME.match(line)
        if m:
            test, outcome = m.groups()
            # A test that failed in its body and then errored in tear-down stays failed.
            if outcomes.get(test) not in ("FAILED", "ERROR"):
                outcomes[test] = outcome
    if not outcomes and not note:
        tail = "\n".join(out.strip().splitlines()[-5:])
        note = f"no test ran: {tail}"
    return outcomes, elapsed, note, torch_own(out)


def torch_own(out: str) -> dict[str, str]:
    """``Class.test`` -> why, for each failure section of pytest's output that shows one
    of the errors PyTorch's switch raises itself (``TORCH_OWN``)."""
    found: dict[str, str] = {}
    name, body = "", list[str]()
    for line in [*out.splitlines(), "___ end ___"]:
        m = _SECTION.match(line)
        if m:
            text = "\n".join(body)
            for signature, why in TORCH_OWN.items():
                if name and signature in text:
                    found[name] = why
                    break
            name, body = m.group(1), []
        else:
            body.append(line)
    return found


def _kill_session(pid: int) -> None:
    """End pytest and the ranks it spawned (they share its process group)."""
    import signal

    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def counts(outcomes: dict[str, str]) -> tuple[int, int, int]:
    """(passed, failed or errored, skipped)."""
    passed = sum(o in ("PASSED", "XFAIL") for o in outcomes.values())
    failed = sum(o in ("FAILED", "ERROR", "XPASS") for o in outcomes.values())
    skipped = sum(o == "SKIPPED" for o in outcomes.values())
    return passed, failed, skipped


def main(argv: list[str] | None = None) -> int:
    """Run the chosen files both ways and report; 1 when a test passes off and fails on."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pytorch", help=f"PyTorch tree (default: ${ENV_TREE})")
    parser.add_argument("--files", nargs="*", help="names or paths of FILES (default: all)")
    parser.add_argument("-k", dest="select", help="pytest -k for every chosen file")
    parser.add_argument("--world-size", type=int, help="world size of default-sized tests")
    parser.add_argument("--switch", choices=("both", "on", "off"), default="both")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per file run")
    parser.add_argument("--logs", type=Path, help="keep each run's pytest output here")
    parser.add_argument("--list", action="store_true", help="list the files and exit")
    parser.add_argument(
        "--clean-python",
        help="the interpreter of an environment with the same torch and none of our "
        "distributions: each file runs there too, and a test that passes there and not "
        "here with the switch off fails the run (installed, not used, changes nothing)",
    )
    args = parser.parse_args(argv)

    if args.list:
        for e in FILES:
            print(f"{e.name:20} {e.path}" + (f"  -k {e.select!r}" if e.select else ""))
        return 0
    tree, why = tree_from(args.pytorch)
    if tree is None:
        print(f"skipped: {why}")
        return 0
    chosen = list(FILES)
    if args.files:
        wanted = set(args.files)
        chosen = [e for e in FILES if e.name in wanted or e.path in wanted]
        known = {e.name for e in FILES} | {e.path for e in FILES}
        extra = [f for f in args.files if f not in known]
        chosen += [TestFile(Path(f).stem, f) for f in extra]
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    modes = {"both": (False, True), "on": (True,), "off": (False,)}[args.switch]

    import torch

    print(f"torch {torch.__version__} ({torch.version.git_version}); tests from {tree}")
    rows: list[tuple[str, str, int, int, int, float, str]] = []
    regressions: list[tuple[str, str]] = []
    torch_side: list[tuple[str, str]] = []
    # Tests that pass in the clean environment and not with our distributions installed.
    installed: list[tuple[str, str]] = []
    for entry in chosen:
        if not (tree / entry.path).is_file():
            print(f"skipped {entry.path}: not in {tree}")
            continue
        seen: dict[bool, dict[str, str]] = {}
        explained: dict[str, str] = {}
        for switched in modes:
            label = "on" if switched else "off"
            log = args.logs / f"{entry.name}-{label}.log" if args.logs else None
            outcomes, secs, note, own = run_file(
                tree, entry, switched, args.select, args.timeout, args.world_size, log
            )
            seen[switched] = outcomes
            if switched:
                explained = own
            p, f, s = counts(outcomes)
            rows.append((entry.path, label, p, f, s, secs, note))
            print(
                f"{entry.path} switch {label}: {p} passed, {f} failed, {s} skipped "
                f"({secs:.0f} s){' - ' + note if note else ''}",
                flush=True,
            )
        if args.clean_python and False in seen:
            log = args.logs / f"{entry.name}-clean.log" if args.logs else None
            outcomes, secs, note, _ = run_file(
                tree,
                entry,
                False,
                args.select,
                args.timeout,
                args.world_size,
                log,
                python=args.clean_python,
            )
            p, f, s_ = counts(outcomes)
            rows.append((entry.path, "clean", p, f, s_, secs, note))
            print(
                f"{entry.path} clean (torch alone): {p} passed, {f} failed, {s_} skipped "
                f"({secs:.0f} s){' - ' + note if note else ''}",
                flush=True,
            )
            for test, outcome in sorted(outcomes.items()):
                if outcome == "PASSED" and seen[False].get(test) != "PASSED":
                    installed.append((test, seen[False].get(test, "not run")))
        if False in seen and True in seen:
            for test, outcome in sorted(seen[False].items()):
                if outcome == "PASSED" and seen[True].get(test) != "PASSED":
                    # pytest's section title: Class.test (node id: file::Class::test).
                    reason = explained.get(".".join(test.split("::")[1:]))
                    if reason is not None:
                        torch_side.append((test, reason))
                    else:
                        regressions.append((test, seen[True].get(test, "not run")))

    print("\n| file | switch | passed | failed | skipped | seconds | note |")
    print("|---|---|---|---|---|---|---|")
    for path, label, p, f, s, secs, note in rows:
        print(f"| {path} | {label} | {p} | {f} | {s} | {secs:.0f} | {note} |")
    if torch_side:
        print(
            f"\n{len(torch_side)} test(s) pass with the switch off and fail with it on inside "
            f"PyTorch's own switch path (docs/pytorch-integration.md):"
        )
        for test, why in torch_side:
            print(f"  {test}: {why}")
    if installed:
        print(
            f"\n{len(installed)} test(s) pass with torch alone and not with torchcomms "
            f"installed (switch off):"
        )
        for test, outcome in installed:
            print(f"  {test}: {outcome}")
    elif args.clean_python:
        print("\nwith the switch off, every test that passes with torch alone passes")
    if regressions:
        print(f"\n{len(regressions)} test(s) pass with the switch off and not with it on:")
        for test, outcome in regressions:
            print(f"  {test}: {outcome}")
        return 1
    if installed:
        return 1
    if len(modes) == 2:
        print(
            "\nevery test that passes with the switch off passes with it on"
            + (", apart from PyTorch's own failures above" if torch_side else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

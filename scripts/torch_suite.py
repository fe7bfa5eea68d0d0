#!/usr/bin/env python3
"""Run PyTorch's own ``DistributedTest`` suite over the torchcomms bridge, as a gate.

The suite ships in the torch wheel (``torch/testing/_internal/distributed/
distributed_test.py``); ``tests/bridge/torch_suite/dist_spawn_suite.py`` wires it as torch's
``test/distributed/test_distributed_spawn.py`` does (gloo, ``WORLD_SIZE`` spawned ranks per
test, ``file://`` rendezvous). With ``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1`` every group of
every test is a torchcomms communicator behind ``_BackendWrapper``.

    python scripts/torch_suite.py                    # 2 ranks: the gate CI runs
    python scripts/torch_suite.py --world-size 4
    python scripts/torch_suite.py --refresh          # plain gloo: rewrite the baseline
    python scripts/torch_suite.py -k barrier         # a subset (no gate on the rest)
    python scripts/torch_suite.py --start spawn      # ranks spawned, as torch does

The gate: every test listed in ``tests/bridge/torch_suite/gloo-<N>ranks-torch<release>.txt``
(the tests that pass on plain gloo with this torch release, written by ``--refresh`` with the
switch off; one per release, ``torch2.13`` and ``torch2.14``) must pass
with the switch on. A listed test that fails, errors or is skipped fails the run; the
summary names each. Tests that plain gloo does not pass (CUDA/NCCL-only ones skip here)
are reported but not gated.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "tests" / "bridge" / "torch_suite" / "dist_spawn_suite.py"


def baseline_path(world_size: int) -> Path:
    """The baseline of this torch release: each release passes its own set on plain gloo."""
    major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    name = f"gloo-{world_size}ranks-torch{major}.{minor}.txt"
    return ROOT / "tests" / "bridge" / "torch_suite" / name


def run_suite(
    world_size: int, switch: bool, junit: Path, select: str | None, timeout: int, start: str
) -> tuple[dict[str, str], float]:
    """Run the suite; the outcome of each test (passed/failed/error/skipped), and seconds."""
    with tempfile.TemporaryDirectory(prefix="torch-suite-") as tmp:
        env = {
            **os.environ,
            "BACKEND": "gloo",
            "WORLD_SIZE": str(world_size),
            "TEMP_DIR": tmp,
            # The suite's per-test limit (torch's default is 300 s).
            "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(timeout),
            "TORCHCOMMS_SUITE_START": start,
        }
        if switch:
            env["TORCH_DISTRIBUTED_USE_TORCHCOMMS"] = "1"
        else:
            env.pop("TORCH_DISTRIBUTED_USE_TORCHCOMMS", None)
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(SUITE.parent),
            str(SUITE),
            f"--junitxml={junit}",
            "-rfE",
        ]
        if select:
            cmd += ["-k", select]
        start = time.monotonic()
        subprocess.run(cmd, env=env, cwd=SUITE.parent, check=False)
        elapsed = time.monotonic() - start
    return outcomes(junit), elapsed


def outcomes(junit: Path) -> dict[str, str]:
    """Test name -> outcome, from pytest's JUnit XML."""
    result: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            result[name] = "failed"
        elif "error" in kinds:
            result[name] = "error"
        elif "skipped" in kinds:
            result[name] = "skipped"
        else:
            result[name] = "passed"
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="run on plain gloo (switch off) and rewrite the baseline list",
    )
    parser.add_argument("-k", dest="select", help="only tests matching this pytest -k expression")
    parser.add_argument("--junit", type=Path, help="keep pytest's JUnit XML here")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test")
    parser.add_argument(
        "--start",
        choices=("fork", "spawn"),
        default="fork",
        help="how each test starts its ranks: fork (default: no second torch import, "
        "several times faster) or spawn (as torch's test_distributed_spawn.py)",
    )
    args = parser.parse_args()

    baseline = baseline_path(args.world_size)
    with tempfile.TemporaryDirectory() as tmp:
        junit = args.junit or Path(tmp) / "suite.xml"
        results, elapsed = run_suite(
            args.world_size, not args.refresh, junit, args.select, args.timeout, args.start
        )
    counts = {k: sum(1 for v in results.values() if v == k) for k in ("passed", "failed", "error")}
    skipped = sum(1 for v in results.values() if v == "skipped")
    mode = "plain gloo" if args.refresh else "TORCH_DISTRIBUTED_USE_TORCHCOMMS=1"
    print(
        f"\nDistributedTest, gloo, {args.world_size} ranks ({args.start}), {mode}, "
        f"torch {torch.__version__}: "
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['error']} errors, "
        f"{skipped} skipped in {elapsed:.0f} s"
    )
    if args.refresh:
        if args.select:
            print("--refresh with -k would write a partial baseline; not written")
            return 2
        passed = sorted(n for n, v in results.items() if v == "passed")
        baseline.write_text(
            f"# DistributedTest tests that pass on plain gloo, {args.world_size} ranks, "
            f"torch {torch.__version__}\n# (written by scripts/torch_suite.py --refresh)\n"
            + "".join(f"{n}\n" for n in passed)
        )
        print(f"wrote {len(passed)} tests to {baseline.relative_to(ROOT)}")
        return 0 if not counts["failed"] and not counts["error"] else 1
    if not baseline.exists():
        print(f"no baseline {baseline.relative_to(ROOT)}: run with --refresh first")
        return 2
    expected = [
        line.strip()
        for line in baseline.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    if args.select:
        expected = [n for n in expected if n in results]
    missing = [(n, results.get(n, "not run")) for n in expected if results.get(n) != "passed"]
    extra = sorted(n for n, v in results.items() if v == "passed" and n not in expected)
    print(
        f"gate: {len(expected) - len(missing)} of {len(expected)} tests that pass on plain "
        f"gloo pass over torchcomms"
    )
    if extra:
        print(f"also passing over torchcomms, not on plain gloo: {', '.join(extra)}")
    for name, outcome in missing:
        print(f"  {outcome}: {name}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

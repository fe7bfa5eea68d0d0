"""The shipped conformance suite passes for ``hier`` at 4 and 8 ranks on simulated hosts, run
as a vendor runs it, with each rank's host and local backend set by ``--torchcomms-rank-env``.

The 8-rank layouts (4 x 2 and 3 + 3 + 2) carry the marker ``ranks8``; ``-m "not ranks8"``
leaves them out of a quick local run. 3 + 3 + 2 runs in CI. 4 x 2 on shm, 84 s on two cores,
also carries ``long``, which the default run (CI's) deselects: ``pytest -m long`` runs it, and
a change to hier's levels or to shm should."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import torchcomms
from torchcomms_core.testing import run_conformance

# The conformance suite's device-window contracts (test_device_*): they skip on hier, whose
# windows have no device side, and wherever triton is not installed.
DEVICE_CONTRACTS = 3

REPO = Path(__file__).resolve().parents[3]
VENDOR_SRC = REPO / "examples" / "vendor_plugin" / "src"
SHM_MISSING = "shm" not in torchcomms.available_backends()

#: name: (host of each rank, local backend of each host)
CONFIGURATIONS = {
    "2 hosts x 2 on gloo": ("aabb", {"a": "gloo", "b": "gloo"}),
    "uneven 3 + 1, gloo and examplevendor": ("aaab", {"a": "gloo", "b": "examplevendor"}),
    "2 x 2, shm and gloo": ("aabb", {"a": "shm", "b": "gloo"}),
    "2 + 1 + 1, shm, gloo and examplevendor": (
        "aabc",
        {"a": "shm", "b": "gloo", "c": "examplevendor"},
    ),
    "8 ranks, 4 hosts x 2 on shm": ("aabbccdd", {h: "shm" for h in "abcd"}),
    "8 ranks, 3 + 3 + 2, shm, gloo and examplevendor": (
        "aaabbbcc",
        {"a": "shm", "b": "gloo", "c": "examplevendor"},
    ),
}


#: Layouts the default run leaves out (marker ``long``): each runs over a minute on 2 cores.
LONG = {"8 ranks, 4 hosts x 2 on shm"}


def _marks(name: str, hosts: str) -> list[pytest.MarkDecorator]:
    marks = [pytest.mark.ranks8] if len(hosts) == 8 else []
    return marks + [pytest.mark.long] if name in LONG else marks


def _vendor_entry_point(folder: Path) -> str:
    """A dist-info that makes the (uninstalled) example vendor plugin resolvable by entry
    point in the child processes only; returns the PYTHONPATH they need."""
    info = folder / "torchcomms_examplevendor-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torchcomms-examplevendor\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[torchcomms.backends]\nexamplevendor = torchcomms_examplevendor:ExampleVendorBackend\n"
    )
    return os.pathsep.join([str(folder), str(VENDOR_SRC)])


@pytest.mark.parametrize(
    "configuration",
    [pytest.param(name, marks=_marks(name, hosts)) for name, (hosts, _) in CONFIGURATIONS.items()],
)
def test_hier_passes_the_conformance_suite(configuration: str, tmp_path: Path) -> None:
    hosts, backends = CONFIGURATIONS[configuration]
    if SHM_MISSING and "shm" in backends.values():
        pytest.skip("needs the shm backend (torchcomms-shm), which is not installed")
    args = []
    for host in sorted(set(hosts)):
        ranks = ",".join(str(r) for r, h in enumerate(hosts) if h == host)
        args += ["--torchcomms-rank-env", f"{ranks}:TORCHCOMM_HOST_ID=host-{host}"]
        args += ["--torchcomms-rank-env", f"{ranks}:TORCHCOMM_LOCAL_BACKEND={backends[host]}"]
    res = run_conformance(
        "hier",
        len(hosts),
        extra_args=args,
        pythonpath=[_vendor_entry_point(tmp_path / "site")],
        quiet=False,
    )
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    summary = res.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "failed" not in summary
    # Only the device-window contracts may skip: hier's windows offer no device side.
    skipped = re.search(r"(\d+) skipped", summary)
    assert skipped is None or int(skipped.group(1)) == DEVICE_CONTRACTS, summary
    assert f"'hier', {len(hosts)} ranks" in res.stdout
    for host in sorted(set(hosts)):  # the header lists each rank's environment
        assert f"TORCHCOMM_LOCAL_BACKEND={backends[host]}" in res.stdout


def test_rank_env_option_parses_and_refuses_bad_items() -> None:
    from torchcomms_core.testing.plugin import parse_rank_env

    parsed = parse_rank_env(["0,2:TORCHCOMM_HOST_ID=a", "2:X=1=2"], 4)
    assert parsed == {0: {"TORCHCOMM_HOST_ID": "a"}, 2: {"TORCHCOMM_HOST_ID": "a", "X": "1=2"}}
    for bad in ("TORCHCOMM_HOST_ID=a", "4:K=v", "x:K=v", "0:novalue"):
        with pytest.raises(pytest.UsageError, match="RANKS:KEY=VALUE"):
            parse_rank_env([bad], 4)

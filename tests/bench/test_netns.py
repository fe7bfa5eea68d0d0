"""The network-namespace harness: ranks as hosts behind ``tc tbf``-shaped links.

Tests marked ``netns`` build real namespaces and skip, saying why, without root or iproute2;
the others check the harness's messages and parsing anywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from torchcomms_core.bench import netns

NETNS_REASON = netns.unavailable_reason()
needs_netns = pytest.mark.skipif(NETNS_REASON is not None, reason=f"netns: {NETNS_REASON}")


def _leftovers(prefix: str) -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found = [line.split()[0] for line in listing.splitlines() if line.startswith(prefix + "-")]
    names = [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()]
    found += [name for name in names if name.startswith(prefix)]
    return found


@pytest.mark.netns
@needs_netns
def test_traffic_crosses_the_shaped_link_and_results_are_exact(tmp_path) -> None:
    """8 MiB all_reduce between 2 namespaces at 100 Mbit/s: busbw cannot beat the link."""
    out = tmp_path / "run.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torchcomms_core.cli",
            "bench",
            "--netns",
            "2",
            "--link-rate",
            "100mbit",
            "--ops",
            "all_reduce",
            "-b",
            "8M",
            "-e",
            "8M",
            "-n",
            "2",
            "-w",
            "1",
            "--timeout",
            "60",
            "--json",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            netns.remove_stale()  # a killed run could not remove its network itself
    assert proc.returncode == 0, output
    assert _leftovers(f"{netns.PREFIX}{proc.pid}") == [], "the harness left its network behind"
    document = json.loads(out.read_text())
    assert "100mbit" in document["header"]["network"]
    (row,) = document["rows"]
    (result,) = row["passes"]
    assert result["wrong"] == 0
    link_gbps = 100e6 / 8 / 1e9
    assert result["busbw_gbps"] <= 1.2 * link_gbps, (result["busbw_gbps"], output)
    # A link that did nothing at all would show loopback speeds, tens of times faster.
    assert result["busbw_gbps"] >= 0.3 * link_gbps, (result["busbw_gbps"], output)


@pytest.mark.netns
@needs_netns
def test_the_network_is_removed_when_the_body_fails() -> None:
    prefix = f"{netns.PREFIX}{os.getpid()}"
    with pytest.raises(KeyError), netns.shaped_network(2, "1gbit") as net:
        assert sorted(_leftovers(prefix)) == sorted(
            [*net.namespaces, net.bridge, f"{prefix}h0", f"{prefix}h1"]
        )
        qdisc = subprocess.run(
            ["tc", "-n", net.namespaces[1], "qdisc", "show", "dev", netns.INTERFACE],
            capture_output=True,
            text=True,
        ).stdout
        assert "tbf" in qdisc and "1Gbit" in qdisc, qdisc
        raise KeyError("a failing body")
    assert _leftovers(prefix) == []


def test_link_rates_parse_in_tc_units() -> None:
    assert netns.parse_rate("1gbit") == 10**9
    assert netns.parse_rate("10GBIT") == 10**10
    assert netns.parse_rate("2.5gbit") == 2_500_000_000
    assert netns.parse_rate("100mbit") == 10**8
    assert netns.format_rate(10**8) == "100mbit"
    with pytest.raises(ValueError, match="unit among bit, kbit, mbit, gbit, tbit"):
        netns.parse_rate("1 gigabit")


def test_without_root_the_harness_says_what_it_needs(monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "need root" in netns.unavailable_reason()
    with pytest.raises(netns.NetnsError, match="need root"), netns.shaped_network(2, "1gbit"):
        pass


def test_without_iproute2_the_harness_names_the_package(monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None if tool == "tc" else "/x")
    assert netns.unavailable_reason() == (
        "tc not found: install iproute2 (e.g. apt-get install iproute2)"
    )


def test_bench_netns_without_root_is_a_clear_usage_error(monkeypatch, capsys) -> None:
    from torchcomms_core.cli import main

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--netns", "2", "--link-rate", "1gbit"])
    assert exc.value.code == 2
    assert "--netns: network namespaces need root" in capsys.readouterr().err


def test_bench_link_rate_needs_netns(capsys) -> None:
    from torchcomms_core.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "--link-rate", "1gbit"])
    assert "give --netns N too" in capsys.readouterr().err


def test_bench_ranks_per_host_needs_netns(capsys) -> None:
    from torchcomms_core.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "--ranks-per-host", "2"])
    assert "--ranks-per-host places ranks in the namespaces of --netns" in capsys.readouterr().err


def test_bench_compare_names_a_loadable_backend(capsys) -> None:
    from torchcomms_core.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "--backend", "gloo", "--compare", "nosuchengine"])
    err = capsys.readouterr().err
    assert "--compare 'nosuchengine' is neither c10d nor mpi4py" in err


@pytest.mark.netns
@needs_netns
def test_ranks_per_host_share_a_namespace_and_hier_crosses_the_link_once(tmp_path) -> None:
    """2 namespaces of 2 ranks at 100 Mbit/s: hier and flat gloo in one run, both exact.

    A ring over the 4 ranks pushes 1.5 S across the link each way, the hierarchy S, so with
    busbw counted as for a ring, flat gloo cannot beat the link and hier cannot beat 1.5x it.
    """
    out = tmp_path / "run.json"
    env = {k: v for k, v in os.environ.items() if k != "TORCHCOMM_LOCAL_BACKEND"}
    env["TORCHCOMM_LOCAL_BACKEND"] = "gloo"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torchcomms_core.cli",
            "bench",
            "--netns",
            "2",
            "--ranks-per-host",
            "2",
            "--link-rate",
            "100mbit",
            "--backend",
            "hier",
            "--compare",
            "gloo",
            "--ops",
            "all_reduce",
            "-b",
            "8M",
            "-e",
            "8M",
            "-n",
            "2",
            "-w",
            "1",
            "--inplace",
            "1",
            "--timeout",
            "60",
            "--json",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        output, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            netns.remove_stale()
    assert proc.returncode == 0, output
    assert _leftovers(f"{netns.PREFIX}{proc.pid}") == []
    document = json.loads(out.read_text())
    assert "2 ranks in each" in document["header"]["network"]
    assert document["header"]["ranks"] == 4
    link_gbps = 100e6 / 8 / 1e9
    ((hier,),) = [row["passes"] for row in document["rows"]]
    ((flat,),) = [row["passes"] for row in document["compare_rows"]]
    assert hier["wrong"] == 0 and flat["wrong"] == 0
    assert flat["busbw_gbps"] <= 1.2 * link_gbps, output
    assert hier["busbw_gbps"] <= 1.5 * 1.2 * link_gbps, output
    assert "hier / gloo" in output


@pytest.mark.netns
@needs_netns
def test_eight_namespaces_each_behind_a_shaped_link() -> None:
    """The largest network the bench builds for hier (``--netns 8``): eight namespaces, each
    link shaped both ways, distinct addresses, and nothing left after."""
    prefix = f"{netns.PREFIX}{os.getpid()}"
    with netns.shaped_network(8, "1gbit", ranks_per_host=2) as net:
        assert net.nranks == 16 and net.host_of(15) == 7
        assert len({net.address(h) for h in range(8)}) == 8
        for h, ns in enumerate(net.namespaces):
            inside = subprocess.run(
                ["tc", "-n", ns, "qdisc", "show", "dev", netns.INTERFACE],
                capture_output=True,
                text=True,
            ).stdout
            outside = subprocess.run(
                ["tc", "qdisc", "show", "dev", f"{prefix}h{h}"], capture_output=True, text=True
            ).stdout
            assert "tbf" in inside and "1Gbit" in inside, (ns, inside)
            assert "tbf" in outside and "1Gbit" in outside, (ns, outside)
    assert _leftovers(prefix) == []

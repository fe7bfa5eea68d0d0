"""Several "hosts" on one machine: network namespaces joined by rate-limited links.

Each rank runs in its own namespace (or ``ranks_per_host`` ranks share one, as on a host),
linked to a shared bridge by a veth pair whose two ends are shaped by ``tc tbf`` to the link
rate (each direction, like a full-duplex NIC). The ranks rendezvous over the bridge addresses
and gloo binds to the namespace's interface (``TORCHCOMM_GLOO_INTERFACE``), so every byte
between namespaces crosses a shaped link; ranks of one namespace reach each other without it.
Needs root and iproute2 (``ip``, ``tc``).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

from torchcomms_core.foundation import env as _env

#: Name prefix of everything the harness creates; the owner's process id follows it, so a
#: later run can remove what a killed run left behind.
PREFIX = "tcb"
#: The interface every rank's namespace sees (the same name in each, so one setting fits all).
INTERFACE = "eth0"
#: The bridge's subnet; the rank ``r`` host has address ``.r+1``. Each run has its own
#: bridge, so runs side by side never see each other's addresses.
SUBNET = "10.77.0"
#: Named link rates (``--link-rate`` also takes any ``<number><unit>``).
PROFILES: dict[str, str] = {"1gbit": "1gbit", "10gbit": "10gbit"}
#: Port of the rendezvous store in rank 0's namespace.
STORE_PORT = 29500
#: Seconds an ``ip``/``tc`` command may take.
COMMAND_TIMEOUT_S = 30

_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?bit)\s*$", re.IGNORECASE)
_CLONE_NEWNET = 0x40000000


class NetnsError(RuntimeError):
    """The harness cannot run here, or a command that builds the network failed."""


def parse_rate(text: str) -> int:
    """Bits per second of a rate such as ``1gbit``, ``100mbit`` or ``2.5gbit`` (tc's units)."""
    match = _RATE.match(text)
    if match is None:
        raise ValueError(
            f"link rate {text!r} is not understood; give a number and a unit among "
            f"{', '.join(_UNITS)}, e.g. 1gbit, 10gbit or 100mbit"
        )
    bits = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if bits < 8000:
        raise ValueError(f"link rate {text!r} is below 8kbit; give a faster link")
    return int(bits)


def format_rate(bits: int) -> str:
    """``1gbit``, ``100mbit``, ... for a rate in bits per second."""
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits % _UNITS[unit] == 0:
            return f"{bits // _UNITS[unit]}{unit}"
    return f"{bits}bit"


def unavailable_reason() -> str | None:
    """Why the harness cannot run on this machine, or ``None`` when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return (
            "network namespaces need root: run as root (e.g. sudo, or a container with "
            "CAP_NET_ADMIN and CAP_SYS_ADMIN)"
        )
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return (
            f"{' and '.join(missing)} not found: install iproute2 (e.g. apt-get install iproute2)"
        )
    return None


def _run(args: list[str]) -> str:
    try:
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise NetnsError(f"`{' '.join(args)}` did not finish in {COMMAND_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise NetnsError(f"`{' '.join(args)}` failed: {done.stderr.strip() or done.stdout}")
    return done.stdout


def _tbf(rate_bits: int) -> list[str]:
    """``tc`` arguments of a token bucket at ``rate_bits`` b/s.

    The bucket holds 4 ms of traffic (at least 64 KiB, a full GSO segment, so large
    segments are not split), and packets wait at most 20 ms for tokens.
    """
    burst = max(64 << 10, rate_bits // 8 // 250)
    return ["tbf", "rate", f"{rate_bits}bit", "burst", str(burst), "latency", "20ms"]


@dataclasses.dataclass(frozen=True)
class Network:
    """``size`` namespaces on one bridge, links shaped to ``rate_bits`` each way, each the
    "host" of ``ranks_per_host`` ranks (rank ``r`` in namespace ``r // ranks_per_host``)."""

    prefix: str
    size: int
    rate_bits: int
    ranks_per_host: int = 1

    @property
    def nranks(self) -> int:
        """Ranks of the job: ``size * ranks_per_host``."""
        return self.size * self.ranks_per_host

    def host_of(self, rank: int) -> int:
        """The namespace (host) index of ``rank``."""
        return rank // self.ranks_per_host

    @property
    def namespaces(self) -> list[str]:
        return [f"{self.prefix}-{r}" for r in range(self.size)]

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    def address(self, rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    @property
    def description(self) -> str:
        per_host = (
            f", {self.ranks_per_host} ranks in each (unshaped between them)"
            if self.ranks_per_host > 1
            else ""
        )
        return (
            f"{self.size} network namespaces on a bridge, veth links shaped by tc tbf to "
            f"{format_rate(self.rate_bits)} each way{per_host}"
        )

    def rank_environment(self, rank: int) -> dict[str, str | None]:
        """What rank ``rank`` needs to rendezvous and bind over the bridge.

        The store is a TCP store in rank 0's namespace (a file store would bypass the
        network); any port is free in a namespace of its own. ``TORCHCOMM_HOST_ID`` names
        the rank's namespace, so backends that group ranks by host (hier) see the hosts.
        """
        return {
            "TORCHCOMM_HOST_ID": self.namespaces[self.host_of(rank)],
            "TORCHCOMM_LOCAL_RANK": str(rank % self.ranks_per_host),
            _env.MASTER_ADDR: self.address(0),
            _env.MASTER_PORT: str(STORE_PORT),
            _env.STORE_PATH: None,
            _env.GLOO_INTERFACE: INTERFACE,
            # torch.distributed's own gloo groups (``--compare c10d``) bind through this one.
            "GLOO_SOCKET_IFNAME": INTERFACE,
            # UCX (the engine under torchcomms-nixl) would reach the other namespaces through
            # shared memory, since they share the machine; hosts share none, so it takes TCP
            # over the shaped interface, as between hosts without RDMA.
            "UCX_TLS": "tcp",
            "UCX_NET_DEVICES": INTERFACE,
        }


def _host_link(prefix: str, rank: int) -> str:
    return f"{prefix}h{rank}"


def _build(net: Network) -> None:
    _run(["ip", "link", "add", net.bridge, "type", "bridge"])
    _run(["ip", "link", "set", net.bridge, "up"])
    shape = _tbf(net.rate_bits)
    for rank, ns in enumerate(net.namespaces):
        host, inner = _host_link(net.prefix, rank), f"{net.prefix}n{rank}"
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", host, "type", "veth", "peer", "name", inner])
        _run(["ip", "link", "set", inner, "netns", ns])
        _run(["ip", "-n", ns, "link", "set", inner, "name", INTERFACE])
        _run(["ip", "-n", ns, "addr", "add", f"{net.address(rank)}/24", "dev", INTERFACE])
        _run(["ip", "-n", ns, "link", "set", INTERFACE, "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "link", "set", host, "master", net.bridge])
        _run(["ip", "link", "set", host, "up"])
        # Egress of each end: what the rank sends, and what the bridge delivers to it.
        _run(["tc", "-n", ns, "qdisc", "replace", "dev", INTERFACE, "root", *shape])
        _run(["tc", "qdisc", "replace", "dev", host, "root", *shape])


def _teardown(prefix: str) -> list[str]:
    """Remove everything named ``prefix``; returns the problems (never raises)."""
    problems = []
    # Host ends first: deleting one end of a veth pair deletes the other, synchronously.
    links = sorted(_links_with(prefix), key=lambda name: name.endswith("br"))
    commands = [["ip", "link", "del", link] for link in links]
    commands += [["ip", "netns", "del", ns] for ns in _namespaces_with(prefix)]
    for args in commands:
        try:
            _run(args)
        except NetnsError as exc:
            # Gone already (removed with its peer, or by a concurrent cleanup): fine.
            if "Cannot find device" not in str(exc) and "No such file" not in str(exc):
                problems.append(str(exc))
    return problems


def _namespaces_with(prefix: str) -> list[str]:
    try:
        listing = _run(["ip", "netns", "list"])
    except NetnsError:
        return []
    names = [line.split()[0] for line in listing.splitlines() if line.strip()]
    return [name for name in names if name.startswith(prefix + "-")]


def _links_with(prefix: str) -> list[str]:
    try:
        listing = _run(["ip", "-o", "link", "show"])
    except NetnsError:
        return []
    links = []
    for line in listing.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(prefix) and name[len(prefix) :][:1] in ("b", "h", "n"):
                links.append(name)
    return links


def remove_stale() -> list[str]:
    """Remove what runs whose process no longer exists left behind; returns their prefixes."""
    owners = set()
    for name in _namespaces_with(PREFIX) + _links_with(PREFIX):
        match = re.match(rf"^{PREFIX}(\d+)", name)
        if match:
            owners.add(int(match.group(1)))
    removed = []
    for pid in sorted(owners):
        if not _alive(pid):
            _teardown(f"{PREFIX}{pid}")
            removed.append(f"{PREFIX}{pid}")
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def shaped_network(size: int, rate: str | int, ranks_per_host: int = 1) -> Iterator[Network]:
    """Build ``size`` namespaces linked at ``rate`` (``"1gbit"`` or bits per second), for
    ``ranks_per_host`` ranks each, yield the :class:`Network`, and remove it all afterwards,
    also when the body fails."""
    reason = unavailable_reason()
    if reason is not None:
        raise NetnsError(reason)
    if size < 1:
        raise ValueError(f"need at least one namespace, got {size}")
    rate_bits = parse_rate(rate) if isinstance(rate, str) else int(rate)
    remove_stale()
    if ranks_per_host < 1:
        raise ValueError(f"need at least one rank per namespace, got {ranks_per_host}")
    net = Network(f"{PREFIX}{os.getpid()}", size, rate_bits, ranks_per_host)
    _teardown(net.prefix)  # a previous network of this very process, if one was left
    try:
        _build(net)
        yield net
    finally:
        problems = _teardown(net.prefix)
        if problems:
            raise NetnsError("could not remove the network: " + "; ".join(problems))


def enter_namespace(name: str) -> None:
    """Move this process (its calling thread, and every thread it starts later) into the
    network namespace ``name``. Call it first thing in a fresh process."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(f"cannot enter network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def run_rank_in(net: Network, target: Callable[..., int], args: tuple[Any, ...]) -> int:
    """In a rank process started by ``launch``: enter this rank's namespace, point the
    rendezvous and gloo at the bridge, then run ``target(*args)``."""
    rank = int(os.environ[_env.RANK])
    enter_namespace(net.namespaces[net.host_of(rank)])
    for key, value in net.rank_environment(rank).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    return target(*args)


def launch_in_namespaces(
    net: Network, target: Callable[..., int], args: tuple[Any, ...] = (), *, label: str
) -> int:
    """Run ``target(*args)`` on ``net.ranks_per_host`` ranks per namespace of ``net``; the
    job's exit status."""
    from torchcomms_core.bench.launch import launch

    return launch(net.nranks, run_rank_in, (net, target, args), label=label)

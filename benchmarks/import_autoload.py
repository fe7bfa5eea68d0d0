"""What registering torchcomms backends with c10d costs ``import torch`` (#47).

Runs ``python -c "import torch"`` in fresh processes, alternating the autoload on and off
(``TORCHCOMM_C10D_AUTOLOAD=0``) so that both see the same machine, and prints the median of
each; then times the registration itself in one process (``autoload()`` after
``import torch`` with the autoload off), which the wall-clock medians cannot resolve.

    python benchmarks/import_autoload.py [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

_IN_PROCESS = """
import time, torch, torch.distributed as dist
import torchcomms
t = time.perf_counter()
torchcomms.register_c10d_backends()
dt = time.perf_counter() - t
assert "SHM" in dist.Backend._plugins
print(dt)
"""


def _import_time(autoload: bool) -> float:
    env = dict(os.environ)
    env["TORCHCOMM_C10D_AUTOLOAD"] = "1" if autoload else "0"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], env=env, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        print(f"load before: {f.read().split()[:3]}")
    _import_time(True)  # warm the page cache
    on, off = [], []
    for _ in range(args.runs):
        on.append(_import_time(True))
        off.append(_import_time(False))
    m_on, m_off = statistics.median(on), statistics.median(off)
    print(f"import torch, autoload on : median {m_on * 1e3:7.1f} ms of {args.runs}")
    print(f"import torch, autoload off: median {m_off * 1e3:7.1f} ms of {args.runs}")
    print(f"difference: {(m_on - m_off) * 1e3:+.1f} ms ({(m_on / m_off - 1) * 100:+.1f}%)")
    env = dict(os.environ, TORCHCOMM_C10D_AUTOLOAD="0")
    inner = []
    for _ in range(5):
        out = subprocess.run(
            [sys.executable, "-c", _IN_PROCESS], env=env, check=True, capture_output=True, text=True
        )
        inner.append(float(out.stdout.strip()))
    ms = statistics.median(inner) * 1e3
    print(f"the registration itself (in process): median {ms:.2f} ms of 5")


if __name__ == "__main__":
    main()

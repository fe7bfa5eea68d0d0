"""The priority of Gloo's event-loop thread, lowered on machines with fewer cores than
their ranks' threads.

Gloo's TCP transport runs one event-loop thread per engine (``gloo_tcp_loop``). When a
socket becomes readable, the loop handles it only if it can take the pair's lock at once;
otherwise it returns to ``epoll_wait``, which reports the same readable socket again at
once (level-triggered). The lock is held by the rank's own thread while it posts a send or
a receive, through the writes into the kernel's network stack. On a machine where every
core is busy, that thread can be preempted while it holds the lock, and the loop then
spins until it runs again: measured with 8 ranks of one rank per network namespace on 2
cores, 97% of the loops' ``epoll_wait`` returns were followed by another with nothing
read, in runs of up to 4.5 ms, and the spinning took the CPU the lock holder needed.

At the lowest priority (nice 19) the loop still runs whenever a core is free, and a
spinning loop gives way to the threads that hold the lock. Measured on the same machine
(docs/benchmarks.md): gloo's 8-byte all_reduce at 8 namespaces went from 3,785 to
2,839 us, and at 2 namespaces from 857 to 485 us.

The cost is where cores are all busy with computation: a loop at nice 19 then waits behind
it. So by default (``auto``) the priority is lowered only where the launcher says this
machine runs so many ranks that each rank's thread and its loop cannot have a core each
(``2 x local ranks > usable cores``). Hint ``loop_nice`` (``auto``, or a nice value from
0 to 19) or ``TORCHCOMM_GLOO_LOOP_NICE`` decides otherwise.

Linux only: elsewhere the threads are left as they are.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

from torchcomms_core.plugin import (
    CommInputError,
    launcher_local_ranks,
    usable_cores,
)

LOOP_NICE = "loop_nice"
LOOP_NICE_VARIABLE = "TORCHCOMM_GLOO_LOOP_NICE"
#: The name Gloo gives its event-loop threads.
LOOP_THREAD_NAME = "gloo_tcp_loop"
#: The nice value ``auto`` gives the loop where ranks outnumber cores.
OVERSUBSCRIBED_NICE = 19
logger = logging.getLogger(__name__)


def _parse(raw: str, where: str) -> int | None:
    """``auto`` (``None``) or a nice value from 0 to 19."""
    text = raw.strip().lower()
    if text in ("", "auto"):
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 19:
        raise CommInputError(
            f"{where}={raw!r}: give auto or a nice value from 0 (leave gloo's event-loop "
            f"thread as it is) to 19 (lowest priority)"
        )
    return value


def local_ranks() -> int | None:
    """The number of ranks on this machine, as the launcher says (``None``: unknown)."""
    return launcher_local_ranks()


def loop_nice(hints: dict[str, str]) -> int:
    """The nice value for the event loops of a communicator built with ``hints``.

    Raises:
        CommInputError: the hint or the variable is neither ``auto`` nor 0 to 19.
    """
    if LOOP_NICE in hints:
        chosen = _parse(hints[LOOP_NICE], f"hint {LOOP_NICE}")
    else:
        chosen = _parse(os.environ.get(LOOP_NICE_VARIABLE, ""), LOOP_NICE_VARIABLE)
    if chosen is not None:
        return chosen
    ranks = local_ranks()
    if ranks is not None and 2 * ranks > usable_cores():
        return OVERSUBSCRIBED_NICE
    return 0


def loop_threads() -> set[int]:
    """The ids of this process's Gloo event-loop threads (empty off Linux)."""
    if not sys.platform.startswith("linux"):
        return set()
    found: set[int] = set()
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as comm:
                name = comm.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name == LOOP_THREAD_NAME:
            found.add(int(tid))
    return found


@contextlib.contextmanager
def lowered(nice: int) -> Iterator[None]:
    """Give the event-loop threads started inside this block the priority ``nice``.

    Threads of engines built before, by this plugin or by anyone else in the process,
    are left alone. A thread whose priority cannot be changed is logged and left as is.
    """
    if nice <= 0:
        yield
        return
    before = loop_threads()
    yield
    for tid in loop_threads() - before:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError as exc:
            logger.warning(
                "gloo: could not lower the priority of event-loop thread %d to nice %d (%s); "
                "it keeps its priority",
                tid,
                nice,
                exc,
            )

"""The small all-reduce in C (``native.c``), built at run time with the system's compiler.

An 8-byte all-reduce on two ranks costs about 2.5 us in the memoryview path of
``torchcomms_shm.small``, of which one flag round is about 1 us; the rest is the
interpreter. ``native.c`` does the same steps (stage, publish, poll, fold) in one call. It
is compiled once per source and machine into a private cache directory
(``$TORCHCOMM_CACHE_DIR/native``, default ``~/.cache/torchcomms/native``), and loaded with
ctypes. Where no compiler is found, or the build fails, the memoryview path runs: the
results are the same bits either way, and ranks on either path work together (the
protocol and the fold order are the same).

The library and its directory must belong to this user and be writable by no one else;
otherwise it is not loaded (said in the log). The hint ``native=false`` (or
``TORCHCOMM_SHM_NATIVE=0``) keeps every call in Python.

May import: the standard library and ``torchcomms_core.plugin``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import sysconfig
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchcomms_core.plugin import NativeBuild

_log = logging.getLogger(__name__)

#: The source, next to this module.
SOURCE = Path(__file__).with_name("native.c")
#: Ranks the C plan holds peer words for (``TC_MAX_RANKS`` in ``native.c``).
MAX_RANKS = 64
#: dtype codes of ``native.c`` by torch dtype name.
DTYPES = {"float32": 0, "float64": 1, "int32": 2, "int64": 3}


class Plan(ctypes.Structure):
    """``tc_plan`` of ``native.c``, field for field."""

    _fields_ = [
        ("user", ctypes.c_void_p),
        ("slots", ctypes.c_void_p * 2),
        ("stride", ctypes.c_int64),
        ("words", ctypes.c_void_p),
        ("my_step", ctypes.c_int64),
        ("peer_steps", ctypes.c_int64 * MAX_RANKS),
        ("sleep_words", ctypes.c_int64 * MAX_RANKS),
        ("nbytes", ctypes.c_int64),
        ("count", ctypes.c_int64),
        ("polls", ctypes.c_int64),
        ("step", ctypes.c_int64),
        ("total", ctypes.c_int64),
        ("my_size", ctypes.c_int64 * 2),
        ("peer_sizes", (ctypes.c_int64 * MAX_RANKS) * 2),
        ("half", ctypes.c_int32),
        ("nranks", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
    ]


class Library:
    """The loaded functions: ``all_reduce(plan_pointer) -> int`` (bits: 1 done, 2 wake the
    sleepers, 4 fold with torch) and ``fold(plan_pointer) -> int`` (0: fold with torch)."""

    def __init__(self, path: Path) -> None:
        # PyDLL: the GIL stays held (the polls are bounded), which saves its release and
        # reacquisition on every call.
        lib = ctypes.PyDLL(str(path))
        self.path = path
        self.all_reduce = lib.tc_small_all_reduce
        self.all_reduce.restype = ctypes.c_int
        self.all_reduce.argtypes = [ctypes.POINTER(Plan)]
        self.fold = lib.tc_small_fold
        self.fold.restype = ctypes.c_int
        self.fold.argtypes = [ctypes.POINTER(Plan)]


#: ``-O3``: the folds vectorise (each element's additions keep their order and rounding).
CFLAGS = ("-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math")
_BUILD = NativeBuild(
    "shm_small", SOURCE, "TORCHCOMM_SHM_NATIVE", "small all-reduces run in Python", CFLAGS
)
_lock = threading.Lock()
_loaded: Library | None = None
_tried = False

#: The CPython entry (``fastcall.c``, which includes ``native.c``): built with the
#: interpreter's headers, loaded as an extension module.
FASTCALL_SOURCE = Path(__file__).with_name("fastcall.c")
_FAST_BUILD = NativeBuild(
    "shm_fastcall",
    FASTCALL_SOURCE,
    "TORCHCOMM_SHM_NATIVE",
    "the compiled small all-reduce is called through ctypes",
    (*CFLAGS, f"-I{sysconfig.get_paths()['include']}", f"-I{SOURCE.parent}"),
    depends=(SOURCE,),
)
_fast: Callable[[int, int, int, int], int] | None = None
_fast_tried = False


def load_fastcall() -> Callable[[int, int, int, int], int] | None:
    """``all_reduce(plan_address, half, step, user_address)`` of ``fastcall.c``, built on
    first use; ``None`` where it cannot be (no headers, a failed build; said in the log)."""
    global _fast, _fast_tried
    if _fast_tried:
        return _fast
    with _lock:
        if not _fast_tried:
            try:
                path = _FAST_BUILD.path()
                if path is not None:
                    spec = importlib.util.spec_from_file_location("_tc_shm_fastcall", path)
                    if spec is not None and spec.loader is not None:
                        module = importlib.util.module_from_spec(spec)
                        spec.loader.exec_module(module)
                        _fast = module.all_reduce
            except (OSError, ImportError) as exc:
                _log.warning(
                    "torchcomms-shm: the CPython entry did not load (ctypes serves): %s", exc
                )
            finally:
                _fast_tried = True
    return _fast


def load() -> Library | None:
    """The compiled small all-reduce, built on first use; ``None`` where it cannot be (no
    compiler, a failed build, or ``TORCHCOMM_SHM_NATIVE=0``), said once in the log."""
    global _loaded, _tried
    if _tried:
        return _loaded
    with _lock:
        if not _tried:
            try:
                path = _BUILD.path()
                _loaded = Library(path) if path is not None else None
            except OSError as exc:  # a library that does not load
                _log.warning(
                    "torchcomms-shm: loading failed, small all-reduces run in Python: %s", exc
                )
            finally:
                _tried = True
    return _loaded


def make_plan(
    user: int,
    slot_bases: tuple[int, int],
    stride: int,
    words: int,
    my_step: int,
    peer_steps: list[int],
    sleep_words: list[int],
    nbytes: int,
    count: int,
    polls: int,
    rank: int,
    nranks: int,
    dtype: int,
    total: int,
    my_size: list[int],
    peer_sizes: list[list[int]],
) -> tuple[Plan, Any]:
    """A filled ``tc_plan`` and the pointer to pass (made once per size)."""
    plan = Plan()
    plan.total = total
    for h in (0, 1):
        plan.my_size[h] = my_size[h]
        for i, word in enumerate(peer_sizes[h]):
            plan.peer_sizes[h][i] = word
    plan.user = user
    plan.slots[0], plan.slots[1] = slot_bases
    plan.stride = stride
    plan.words = words
    plan.my_step = my_step
    for i, word in enumerate(peer_steps):
        plan.peer_steps[i] = word
    for i, word in enumerate(sleep_words):
        plan.sleep_words[i] = word
    plan.nbytes, plan.count, plan.polls = nbytes, count, polls
    plan.rank, plan.nranks, plan.dtype = rank, nranks, dtype
    return plan, ctypes.pointer(plan)

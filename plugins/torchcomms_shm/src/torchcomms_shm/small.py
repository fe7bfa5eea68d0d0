"""``SmallCollectives``: small collectives without torch operators on the critical path.

A small collective costs little more than its waits, so what runs around them counts: a
torch operator goes through the dispatcher (microseconds each), a ``ctypes.memmove`` asks
for both tensors' addresses. Here every copy is a slice assignment between memoryviews,
cached per tensor (over the user's tensor, which the cache holds, and over the segment's
slots), and a small all-reduce folds the staged copies with Python's arithmetic, element
by element, in rank order, as the general path folds them with torch's kernels.

Results are exactly the general path's:

- float32 and float64 sums and products: each step is computed in double precision and
  rounded to the element type when stored, which rounds correctly (a double holds the
  exact sum or product of two float32, and rounding a correctly rounded double sum to
  float32 again is innocuous: 53 >= 2 * 24 + 2), as torch's float32 kernels do;
- integers: exact, and a result out of the type's range (torch wraps it) is left to
  torch's kernels: the memoryview refuses to store it and the fold starts again there;
- float MAX and MIN: a NaN or a zero (where torch's choice between -0.0 and 0.0 depends
  on its vector lanes) is left to torch's kernels the same way, as is a float32 overflow.

A fold handed back to torch runs over the same staged copies (they stay until this rank
posts its next step), so the communicator's state is the same either way.

Which calls take this path is decided from what every rank passes alike (the operation,
its dtype, size and reduction), so every rank takes the same number of steps.

It is a part of the backend: it takes the communicator's
:class:`~torchcomms_shm.lockstep.Lockstep`; the backend's spec methods try it first (its
methods answer ``False`` where a call is not small), and the backend's lean all-reduce
makes the compiled call of a planned tensor itself, with this part's plans and calls.

May import: torch, the standard library, ``torchcomms_core.plugin`` and this package's
``collectives`` (its fold), ``lockstep`` and ``native``.
"""

from __future__ import annotations

import ctypes
import operator
from collections.abc import Callable
from typing import Any

import torch

from torchcomms_core.plugin import CommInputError, RedOpType, Tuning

from . import native
from .collectives import _REDUCE, SMALL_BYTES, _fold
from .lockstep import Lockstep

#: The memoryview format of each dtype whose reductions fold in Python.
_FORMATS: dict[torch.dtype, str] = {
    torch.float32: "f",
    torch.float64: "d",
    torch.int32: "i",
    torch.int64: "q",
    torch.int16: "h",
    torch.int8: "b",
    torch.uint8: "B",
}
_FLOATS = frozenset({torch.float32, torch.float64})

#: Element-wise Python operations (results checked by the store, see the module docstring).
_PY_OPS: dict[RedOpType, Callable[[Any, Any], Any]] = {
    RedOpType.SUM: operator.add,
    RedOpType.PRODUCT: operator.mul,
    RedOpType.BAND: operator.and_,
    RedOpType.BOR: operator.or_,
    RedOpType.BXOR: operator.xor,
}

#: A small all-reduce folds in Python while ``elements * (ranks - 1)`` stays at most this;
#: above, torch's kernels fold (one operator call per peer) over cached views. Measured
#: in one process (``timeit``, best of 7, float32 SUM of two 8-element views, load 12 on
#: 2 cores): Python 0.6 us for 2 elements and 3.3-3.6 us for 4-8, ``torch.add(out=)``
#: 3.6 us whatever the size (1.1 us on a quieter moment).
FOLD_OPS = 8

#: The compiled one-step call polls ``bytes >> POLL_SHIFT`` times (at least 200, at most
#: ``MAX_POLLS``, about 0.1 ms) before the waiter takes over, where every rank has a core.
#: Eight times as many polls made no difference with a test suite running beside.
POLL_SHIFT = 6
MAX_POLLS = 1 << 13

#: Cached user tensors per communicator (the cache holds them alive; it is emptied when
#: full, so at most this many small tensors are kept).
_CACHED_TENSORS = 32


class _Slow(Exception):
    """A value the Python fold cannot reproduce exactly: torch's kernels fold instead."""


def _fold_py(op: RedOpType, floats: bool, srcs: list[memoryview], out: memoryview) -> None:
    """``out = srcs[0] op srcs[1] op ...`` in list order, element by element."""
    k = len(out)
    first, second = srcs[0], srcs[1]
    if op is RedOpType.SUM:  # the common case, without a call per element
        for i in range(k):
            out[i] = first[i] + second[i]
        for src in srcs[2:]:
            for i in range(k):
                out[i] += src[i]
        return
    fn = _PY_OPS.get(op)
    if fn is not None:
        for i in range(k):
            out[i] = fn(first[i], second[i])
        for src in srcs[2:]:
            for i in range(k):
                out[i] = fn(out[i], src[i])
        return
    take_first = operator.gt if op is RedOpType.MAX else operator.lt
    for step, src in enumerate(srcs[1:]):
        left = first if step == 0 else out
        for i in range(k):
            a, b = left[i], src[i]
            m = a if take_first(a, b) else b
            if floats and (m == 0 or a != a or b != b):
                raise _Slow
            out[i] = m


def _no_call(cref: Any) -> int:
    """Stands in for the compiled call where it is not loaded (never reached: no plan has
    a compiled piece then)."""
    return 0


class _Plan:
    """A small all-reduce of one tensor: what the checks found, and the views it copies
    through (``user`` is ``None`` when the call is not small: the general path runs)."""

    __slots__ = (
        "tensor",
        "ptr",
        "nbytes",
        "op",
        "tuning",
        "user",
        "slots",
        "py",
        "floats",
        "pieces",
        "one",
    )

    def __init__(self, tensor: torch.Tensor, ptr: int, nbytes: int, op: RedOpType, tuning: Any):
        self.tensor, self.ptr, self.nbytes, self.op, self.tuning = tensor, ptr, nbytes, op, tuning
        self.user: memoryview | None = None
        self.slots: tuple[list[memoryview], list[memoryview]] | None = None
        self.py = False
        self.floats = False
        #: The compiled path: per piece of at most half a slot, its ``tc_plan``, the
        #: pointer to pass, and the piece of the tensor (empty: not compiled).
        self.pieces: list[tuple[native.Plan, Any, torch.Tensor]] = []
        #: The one piece's plan, pointer and address, when the tensor fits in one (the
        #: lean lane's call).
        self.one: tuple[native.Plan, Any, int] | None = None


class SmallCollectives:
    """The memoryview and compiled paths of small collectives (see the module docstring)."""

    def __init__(self, state: Lockstep) -> None:
        self._st = state
        #: Bytes up to which the memoryview path runs (the hint, at most half a slot).
        self.limit = 0
        self._slot_bytes: list[list[memoryview]] = []
        #: (format, bytes, half) -> a memoryview per rank's slot.
        self._slot_views: dict[tuple[str, int, int], list[memoryview]] = {}
        #: id(tensor) -> (tensor, address, bytes, {format: memoryview}).
        self._user_views: dict[int, tuple[torch.Tensor, int, int, dict[str, memoryview]]] = {}
        #: id(tensor) -> the plan of its small all-reduce (``_all_reduce_plan``).
        self.plans: dict[int, _Plan] = {}
        #: (bytes, dtype code) -> the compiled plans of its pieces, shared by every tensor.
        self._c_plans: dict[tuple[int, int], list[tuple[native.Plan, Any]]] = {}
        #: The compiled small all-reduce (``torchcomms_shm.native``), or ``None``.
        self.native: native.Library | None = None
        #: ``tc_small_all_reduce`` (the lean all-reduce calls it inline), or a stand-in.
        self.native_call: Callable[[Any], int] = _no_call
        #: The same call as a CPython function (``fastcall.c``), or ``None``: ctypes serves.
        self.fastcall: Callable[[int, int, int, int], int] | None = None

    def reset(self, limit: int, native_wanted: bool) -> None:
        """Views over the segment the lockstep was just bound to; ``limit``: the bytes up to
        which the memoryview path runs (at most half a slot); ``native_wanted``: whether
        small all-reduces may take the compiled call."""
        st = self._st
        mapping = st.mapping
        assert mapping is not None
        lay = st.layout
        self.limit = min(limit, lay.half)
        whole = memoryview(mapping.map)
        self._slot_bytes = [
            [
                whole[
                    lay.arena + r * lay.arena_bytes + h * lay.half : lay.arena
                    + r * lay.arena_bytes
                    + (h + 1) * lay.half
                ]
                for h in (0, 1)
            ]
            for r in range(st.size)
        ]
        self._slot_views = {}
        self._user_views = {}
        self.plans = {}
        self._c_plans = {}
        wanted = native_wanted and st.size <= native.MAX_RANKS
        self.native = native.load() if wanted else None
        self.native_call = self.native.all_reduce if self.native is not None else _no_call
        self.fastcall = native.load_fastcall() if self.native is not None else None
        del whole

    def drop_views(self) -> None:
        """Let go of every memoryview over the segment (before it is unmapped)."""
        self._slot_views = {}
        self._user_views = {}
        self.plans = {}
        self._c_plans = {}
        self._slot_bytes = []

    def _user_view(self, tensor: torch.Tensor, fmt: str) -> memoryview:
        """A memoryview of a contiguous CPU tensor's elements (``fmt``), cached per tensor."""
        hit = self._user_views.get(id(tensor))
        ptr, nbytes = tensor.data_ptr(), tensor.nbytes
        if hit is not None and hit[0] is tensor and hit[1] == ptr and hit[2] == nbytes:
            view = hit[3].get(fmt)
            if view is not None:
                return view
            views = hit[3]
        else:
            if len(self._user_views) >= _CACHED_TENSORS:
                self._user_views.clear()
            views = {}
            self._user_views[id(tensor)] = (tensor, ptr, nbytes, views)
        raw = memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B")
        view = views[fmt] = raw.cast(fmt) if fmt != "B" else raw  # type: ignore[call-overload]
        return view

    def _slots_as(self, fmt: str, nbytes: int, h: int) -> list[memoryview]:
        key = (fmt, nbytes, h)
        views = self._slot_views.get(key)
        if views is None:
            if len(self._slot_views) > 64:
                self._slot_views.clear()
            views = self._slot_views[key] = [
                (s[h][:nbytes].cast(fmt) if fmt != "B" else s[h][:nbytes])  # type: ignore[call-overload]
                for s in self._slot_bytes
            ]
        return views

    def _all_reduce_plan(self, tensor: torch.Tensor, op: RedOpType, tuning: Tuning) -> _Plan:
        """What a small all-reduce of ``tensor`` with ``op`` needs, worked out once (the
        checks, the tuner's choice, the memoryviews); cached per tensor."""
        st = self._st
        plans = self.plans
        if len(plans) >= _CACHED_TENSORS:
            plans.clear()
        nbytes, dtype = tensor.nbytes, tensor.dtype
        fmt = _FORMATS.get(dtype)
        one_step = (
            tuning.choose("all_reduce", nbytes, dtype).algorithm == "one_step"
            and nbytes > 0
            and st.size > 1
        )
        plan = _Plan(tensor, tensor.data_ptr(), nbytes, op, tuning)
        lib = self.native
        code = native.DTYPES.get(str(dtype).removeprefix("torch."))
        if one_step and lib is not None and code is not None and op is RedOpType.SUM:
            # Compiled, at any size the tuner gives one step: a piece per half-slot.
            self._native_plan(plan, code)
        elif one_step and fmt is not None and nbytes <= min(SMALL_BYTES, self.limit):
            plan.user = user = self._user_view(tensor, fmt)
            plan.slots = (self._slots_as(fmt, nbytes, 0), self._slots_as(fmt, nbytes, 1))
            plan.py = len(user) * (st.size - 1) <= FOLD_OPS
            plan.floats = dtype in _FLOATS
        if nbytes <= st.chunk:
            # Cached (holding the tensor) only up to one piece: a plan saves a call's
            # checks, which count for small calls only, and the cache must not keep
            # large tensors alive after their owner dropped them.
            plans[id(tensor)] = plan
        return plan

    def _native_plan(self, plan: _Plan, code: int) -> None:
        """Fill ``plan`` for the compiled path (a SUM of float32, float64, int32 or int64):
        one ``tc_plan`` per piece of at most half a slot, each a step of its own."""
        st = self._st
        mapping = st.mapping
        assert mapping is not None
        lay = st.layout
        first = mapping.base + lay.arena
        flat = plan.tensor.view(-1)
        es = flat.element_size()
        per = max(1, st.chunk // es)  # the pieces of the general path's one step
        parts = [flat[start : start + per] for start in range(0, flat.numel(), per)]
        # The C plans depend on the size and dtype only (the user's address is set at
        # each call): made once per size, shared by every tensor of that size.
        key = (plan.nbytes, code)
        made = self._c_plans.get(key)
        if made is not None:
            plan.pieces = [(c, cref, part) for (c, cref), part in zip(made, parts, strict=True)]
            if len(made) == 1:
                plan.one = (*made[0], ctypes.addressof(made[0][0]))
            return
        if len(self._c_plans) >= _CACHED_TENSORS:
            self._c_plans.clear()
        pieces = []
        for part in parts:
            # Polls before the waiter takes over (about 14 ns each here): where every rank
            # has a core, enough to cover a peer's copy of the piece; none where ranks
            # share cores.
            polls = (
                st.fast_polls
                if st.fast_polls <= 1
                else max(200, min(part.nbytes >> POLL_SHIFT, MAX_POLLS))
            )
            c, cref = native.make_plan(
                user=part.data_ptr(),
                slot_bases=(first, first + lay.half),
                stride=lay.arena_bytes,
                words=st.control_at,
                my_step=st.my_step,
                peer_steps=st.peer_steps,
                sleep_words=st.sleep_words,
                nbytes=part.nbytes,
                count=part.numel(),
                polls=polls,
                rank=st.rank,
                nranks=st.size,
                dtype=code,
                total=plan.nbytes,
                my_size=st.my_size,
                peer_sizes=st.peer_sizes,
            )
            pieces.append((c, cref, part))
        self._c_plans[key] = [(c, cref) for c, cref, _ in pieces]
        plan.pieces = pieces
        if len(pieces) == 1:
            plan.one = (pieces[0][0], pieces[0][1], ctypes.addressof(pieces[0][0]))

    def all_reduce(self, tensor: torch.Tensor, op: RedOpType, tuning: Tuning) -> bool:
        """All-reduce a contiguous ``tensor`` in one step (compiled, or through
        memoryviews); ``False`` (nothing done) when ``tuning`` gives it more than one
        step or neither path takes its dtype and reduction."""
        plan = self.plans.get(id(tensor))
        if (
            plan is None
            or plan.tensor is not tensor
            or plan.op is not op
            or plan.tuning is not tuning
            or plan.ptr != tensor.data_ptr()
            or plan.nbytes != tensor.nbytes
        ):
            plan = self._all_reduce_plan(tensor, op, tuning)
        if plan.pieces:  # compiled: stage, publish, poll and fold, a call per piece
            for c, cref, part in plan.pieces:
                self._compiled_step(c, cref, part, op)
            return True
        user = plan.user
        if user is None:
            return False
        st = self._st
        st.use += 1
        h = st.use & 1
        slots = plan.slots[h]  # type: ignore[index]
        slots[st.rank][:] = user
        st.words[st.my_size[h]] = plan.nbytes
        st.sync()
        error = st.size_mismatch(h, plan.nbytes)
        if error is not None:
            raise error
        if plan.py:
            try:
                _fold_py(op, plan.floats, slots, user)
                return True
            except (_Slow, OverflowError, ValueError):
                pass  # torch folds the same staged copies below
        return self._torch_fold(tensor, op, h, plan.nbytes)

    def _compiled_step(self, c: native.Plan, cref: Any, part: torch.Tensor, op: RedOpType) -> None:
        """One step of the compiled one-step all-reduce: ``part`` staged in the next half,
        the step published, the peers awaited, and every rank's copy folded into it."""
        st = self._st
        use = st.use = st.use + 1
        step = st.step = st.step + 1
        fast = self.fastcall
        if fast is not None:
            done = fast(ctypes.addressof(c), use & 1, step, part.data_ptr())
        else:
            c.half, c.step, c.user = use & 1, step, part.data_ptr()
            done = self.native_call(cref)
        self.compiled_rest(c, cref, part, op, done)

    def compiled_rest(
        self, c: native.Plan, cref: Any, part: torch.Tensor, op: RedOpType, done: int
    ) -> None:
        """What follows the C call of a step that returned ``done`` (``tc_small_all_reduce``'s
        bits): wake sleeping peers, wait with the waiter if the polls ran out, fold with
        torch where the C fold met a NaN."""
        st = self._st
        if done & 2:  # a peer sleeps on a step word: wake it, as Lockstep.post does
            st.waiter.futex.wake(st.my_step_at)  # type: ignore[union-attr]
        if done & 1:
            return
        lib = self.native
        assert lib is not None
        if not done & 12:
            st.wait_peers()
            folded = lib.fold(cref)
            if folded == 1:
                return
            if folded == 2:
                done |= 8
        if done & 8:  # a peer announced another size: nothing was folded
            error = st.size_mismatch(c.half, c.total)
            raise (
                error
                if error is not None
                else CommInputError(f"{st.op or 'all_reduce'}: the ranks passed different sizes")
            )
        self._torch_fold(part, op, c.half, part.nbytes)

    def _torch_fold(self, tensor: torch.Tensor, op: RedOpType, h: int, nbytes: int) -> bool:
        """Fold the staged copies of half ``h`` into ``tensor`` with torch's kernels."""
        st = self._st
        dtype = tensor.dtype
        key = (dtype, tensor.numel(), h)
        staged = st.views.get(key)
        if staged is None:
            if len(st.views) > 64:
                st.views.clear()
            staged = st.views[key] = [st.slots[r][h][:nbytes].view(dtype) for r in range(st.size)]
        _fold(_REDUCE[op], staged, tensor.view(-1))
        return True

    def broadcast(self, tensor: torch.Tensor, root: int) -> bool:
        """Broadcast a contiguous ``tensor`` of at most :attr:`limit` bytes in one step;
        ``False`` (nothing done) when it is larger or empty."""
        st = self._st
        nbytes = tensor.nbytes
        if nbytes > self.limit or st.size == 1 or not nbytes:
            return False
        user = self._user_view(tensor, "B")
        slot = self._slot_bytes[root][st.half()]
        if st.rank == root:
            slot[:nbytes] = user
            st.sync()
        else:
            st.sync()
            user[:] = slot[:nbytes]
        return True

    def all_gather(self, outs: list[torch.Tensor], mine: torch.Tensor) -> bool:
        """All-gather contiguous blocks of at most :attr:`limit` bytes each in one step;
        ``outs`` are the output blocks (rank order), ``mine`` this rank's input (it may
        overlap them: it is staged before any block is written). ``False`` (nothing done)
        when a block is larger or all are empty."""
        st = self._st
        c = self.limit
        if st.size == 1 or any(o.nbytes > c for o in outs) or not any(o.nbytes for o in outs):
            return False
        h = st.half()
        me = st.rank
        nbytes = mine.nbytes
        src = self._user_view(mine, "B") if nbytes else None
        if src is not None:
            self._slot_bytes[me][h][:nbytes] = src
        st.post()
        own = outs[me]
        if src is not None and own.data_ptr() != mine.data_ptr():
            self._user_view(own, "B")[:] = src
        st.wait_peers()
        for p in st.peers:
            m = outs[p].nbytes
            if m:
                self._user_view(outs[p], "B")[:] = self._slot_bytes[p][h][:m]
        return True

    def all_gather_single(self, output: torch.Tensor, mine: torch.Tensor) -> bool:
        """:meth:`all_gather` into one contiguous ``output`` of ``size`` equal blocks."""
        st = self._st
        nbytes = mine.nbytes
        if st.size == 1 or not nbytes or nbytes > self.limit:
            return False
        h = st.half()
        me = st.rank
        src = self._user_view(mine, "B")
        out = self._user_view(output, "B")
        self._slot_bytes[me][h][:nbytes] = src
        st.post()
        at = me * nbytes
        if output.data_ptr() + at != mine.data_ptr():
            out[at : at + nbytes] = src
        st.wait_peers()
        for p in st.peers:
            at = p * nbytes
            out[at : at + nbytes] = self._slot_bytes[p][h][:nbytes]
        return True

"""``Collectives``: the shm backend's collective algorithms, lockstep over the arena.

Each algorithm stages what this rank contributes in its slot of the arena, one chunk per
step, and reads or folds what the peers staged (see the backend's module docstring).
Reductions use torch's kernels, in rank order, by one owner rank per part. It is a part
of the backend: it takes the communicator's :class:`~torchcomms_shm.lockstep.Lockstep`,
and the backend's spec methods (``all_reduce``, ``all_gather``, ...) call it, passing the
backend's tuning where a tuner chooses the path.

May import: torch, the standard library, ``torchcomms_core.plugin`` and this package's
``cma``, ``copying``, ``lockstep``, ``measured`` and ``segment``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from torchcomms_core.plugin import (
    ELEMENTWISE_REDUCE,
    CommInputError,
    CommOperationError,
    Tuning,
)

from . import cma
from . import segment as seg
from .copying import copy_to
from .lockstep import Lockstep
from .measured import Meter

#: Messages up to this size per rank (bytes) take the one-step all-reduce.
SMALL_BYTES = 64 << 10

#: The element-wise kernel of each reduction.
_REDUCE = ELEMENTWISE_REDUCE


#: A direct all-reduce reads the peers' parts in pieces of at most this many bytes (the
#: buffers it keeps: one piece per rank, for the last size it ran).
DIRECT_PIECE_BYTES = 4 << 20


def _fold(fn: Callable[..., torch.Tensor], sources: list[torch.Tensor], out: torch.Tensor) -> None:
    """``out = sources[0] op sources[1] op ...`` in list order.

    ``out`` must not overlap any source but the first two (it is written first).
    """
    if len(sources) == 1:
        if sources[0].data_ptr() != out.data_ptr():
            copy_to(out, sources[0])
        return
    fn(sources[0], sources[1], out=out)
    for src in sources[2:]:
        fn(out, src, out=out)


class Collectives:
    """The collective algorithms of the shm backend (see the module docstring)."""

    def __init__(self, state: Lockstep) -> None:
        self._st = state
        #: Rank 0's timings of ``measured`` calls.
        self.meter = Meter()
        #: The piece buffers of the last direct all-reduce (``_all_reduce_direct``).
        self._direct_temps: dict[tuple[torch.dtype, int, int], list[torch.Tensor]] = {}

    def reset(self) -> None:
        """Fresh timings and buffers for the segment the lockstep was just bound to."""
        self.meter = Meter()
        self._direct_temps = {}

    def all_reduce(
        self, flat: torch.Tensor, fn: Callable[..., torch.Tensor], tuning: Tuning
    ) -> None:
        """All-reduce ``flat`` with ``fn`` on the path ``tuning`` chooses for its size."""
        st = self._st
        n, me = st.size, st.rank
        if n == 1:
            return
        dtype, es = flat.dtype, flat.element_size()
        total = flat.numel()
        nbytes = total * es
        # The tuner's choice (#45); one step holds at most a chunk.
        choice = tuning.choose("all_reduce", nbytes, dtype).algorithm
        if choice in ("direct", "measured") and st.cma_ok:
            if choice == "direct":
                self._all_reduce_direct(flat, fn)
            else:
                self.measured(
                    "all_reduce",
                    nbytes,
                    lambda: self._all_reduce_direct(flat, fn),
                    lambda: self._all_reduce_chunked(flat, fn),
                )
            return
        if choice == "one_step":
            # One step per piece of at most a chunk: every rank stages the piece and folds
            # every rank's copy itself (the compiled path of ``small`` takes the same steps).
            per = max(1, st.chunk // es)
            for start in range(0, total, per):
                part = flat[start : start + per]
                m = part.numel()
                h = st.half()
                st.words[st.my_size[h]] = nbytes  # checked by every rank after the step
                key = (dtype, m, h)
                slots = st.views.get(key)
                if slots is None:
                    if len(st.views) > 64:
                        st.views.clear()
                    slots = st.views[key] = [st.slots[r][h][: m * es].view(dtype) for r in range(n)]
                copy_to(slots[me], part)
                st.sync()
                error = st.size_mismatch(h, nbytes)
                if error is not None:
                    raise error
                _fold(fn, slots, part)
            return
        self._all_reduce_chunked(flat, fn)

    def _all_reduce_chunked(self, flat: torch.Tensor, fn: Callable[..., torch.Tensor]) -> None:
        """Per chunk: every rank stages the parts it does not own, reduces its own part
        from the staged copies, and copies the reduced parts of its peers out."""
        st = self._st
        n, me = st.size, st.rank
        dtype, es = flat.dtype, flat.element_size()
        total = flat.numel()
        per = st.chunk // es
        for start in range(0, total, per):
            m = min(per, total - start)
            bounds = [m * p // n for p in range(n + 1)]
            lo, hi = bounds[me], bounds[me + 1]
            h = st.half()
            slots = [st.slots[r][h][: m * es].view(dtype) for r in range(n)]
            chunk = flat[start : start + m]
            mine = slots[me]
            # Stage every part but this rank's own (which it reduces from its tensor).
            if lo:
                copy_to(mine[:lo], chunk[:lo])
            if hi < m:
                copy_to(mine[hi:], chunk[hi:])
            st.sync()
            own = chunk[lo:hi]
            # Into this rank's own (free) region of its slot, then back into the tensor.
            _fold(fn, [own if r == me else slots[r][lo:hi] for r in range(n)], mine[lo:hi])
            copy_to(own, mine[lo:hi])
            st.sync()
            for r in st.peers:
                a, b = bounds[r], bounds[r + 1]
                if b > a:
                    copy_to(chunk[a:b], slots[r][a:b])

    def _all_reduce_direct(self, flat: torch.Tensor, fn: Callable[..., torch.Tensor]) -> None:
        """All-reduce by cross-memory reads, one copy per byte moved: each rank reads its own
        part of every peer's tensor (in pieces of at most :data:`DIRECT_PIECE_BYTES`),
        folds the parts in rank order into its own tensor (so the bits are those of the
        staged path), and after a step reads every peer's reduced part from the peer's
        tensor. A last step keeps every tensor in place until every peer has read it."""
        st = self._st
        n, me = st.size, st.rank
        dtype, es = flat.dtype, flat.element_size()
        total = flat.numel()
        bounds = [total * p // n for p in range(n + 1)]
        h = st.half()
        table = torch.tensor([flat.data_ptr(), total * es], dtype=torch.int64).view(torch.uint8)
        copy_to(st.slots[me][h][:16], table)
        st.sync()
        peers: dict[int, int] = {}
        for p in st.peers:
            addr, nbytes = st.slots[p][h][:16].view(torch.int64).tolist()
            if nbytes != total * es:
                # Every rank meets a peer of another size: all take the remaining steps
                # without reading, so the communicator stays usable.
                st.sync()
                st.sync()
                raise CommInputError(
                    f"{st.op}: rank {p} passed {nbytes} bytes where this rank passed "
                    f"{total * es}; every rank must pass the same size"
                )
            peers[p] = addr
        lo, hi = bounds[me], bounds[me + 1]
        piece = max(1, DIRECT_PIECE_BYTES // es)
        key = (dtype, min(piece, hi - lo), n)
        temps = self._direct_temps.get(key)
        if temps is None:
            self._direct_temps = {}  # one size at a time: the last call's buffers
            temps = self._direct_temps[key] = [
                torch.empty(min(piece, hi - lo), dtype=dtype) for _ in range(n + 1)
            ]
        try:
            for start in range(lo, hi, piece):
                m = min(piece, hi - start)
                own = flat[start : start + m]
                for p, addr in peers.items():
                    cma.read(st.pids[p], temps[p].data_ptr(), addr + start * es, m * es)
                sources = [own if r == me else temps[r][:m] for r in range(n)]
                if me < 2:  # the fold writes its first two sources first: own may be one
                    _fold(fn, sources, own)
                else:
                    _fold(fn, sources, temps[n][:m])
                    copy_to(own, temps[n][:m])
            st.sync()
            for p, addr in peers.items():
                a, b = bounds[p], bounds[p + 1]
                if b > a:
                    cma.read(st.pids[p], flat[a:b].data_ptr(), addr + a * es, (b - a) * es)
        except CommOperationError as exc:
            raise st.fail(exc) from None
        st.sync()

    def reduce_scatter(
        self, out: torch.Tensor, ins: list[torch.Tensor], fn: Callable[..., torch.Tensor]
    ) -> None:
        """Reduce block ``p`` of every rank's ``ins`` into rank ``p``'s ``out``."""
        st = self._st
        n, me = st.size, st.rank
        if n == 1:
            copy_to(out, ins[0])
            return
        dtype, es = out.dtype, out.element_size()
        # Elements per destination per step: a slot holds one region per peer (the one
        # for a destination ``p`` at ``_place(p, owner)``).
        region = st.chunk // (n - 1) // es
        steps = max(-(-t.numel() // region) for t in ins)
        for k in range(steps):
            lo = k * region
            h = st.half()
            base = st.slots
            for p in st.peers:
                m = min(region, ins[p].numel() - lo)
                if m > 0:
                    at = _place(p, me) * region
                    dst = base[me][h][at * es : (at + m) * es].view(dtype)
                    copy_to(dst, ins[p][lo : lo + m])
            st.sync()
            m = min(region, out.numel() - lo)
            if m > 0:
                srcs = [
                    ins[me][lo : lo + m]
                    if r == me
                    else base[r][h][
                        _place(me, r) * region * es : (_place(me, r) * region + m) * es
                    ].view(dtype)
                    for r in range(n)
                ]
                _fold(fn, srcs, out[lo : lo + m])

    def all_gather(self, outs: list[torch.Tensor], mine: torch.Tensor) -> None:
        """Every rank's ``mine`` into block ``rank`` of ``outs``, staged (uint8 tensors)."""
        st = self._st
        n, me, c = st.size, st.rank, st.chunk
        local = outs[me].data_ptr() != mine.data_ptr()
        if n == 1:
            if local:
                copy_to(outs[me], mine)
            return
        steps = max(-(-o.numel() // c) for o in outs)
        for k in range(steps):
            lo = k * c
            h = st.half()
            m = min(c, mine.numel() - lo)
            if m > 0:
                copy_to(st.slots[me][h][:m], mine[lo : lo + m])
            st.post()
            if local and m > 0:  # this rank's own block, while the peers catch up
                copy_to(outs[me][lo : lo + m], mine[lo : lo + m])
            st.wait_peers()
            for p in st.peers:
                m = min(c, outs[p].numel() - lo)
                if m > 0:
                    copy_to(outs[p][lo : lo + m], st.slots[p][h][:m])

    def broadcast(self, data: torch.Tensor, root: int) -> None:
        """``root``'s ``data`` into every rank's, staged (a uint8 tensor)."""
        st = self._st
        if st.size == 1:
            return
        c, me, total = st.chunk, st.rank, data.numel()
        steps = -(-total // c)
        for k in range(steps):
            lo = k * c
            m = min(c, total - lo)
            h = st.half()
            slot = st.slots[root][h][:m]
            if me == root:
                copy_to(slot, data[lo : lo + m])
            st.sync()
            if me != root:
                copy_to(data[lo : lo + m], slot)

    def copy_once_choice(self, op: str, nbytes: int, tuning: Tuning) -> str:
        """The path of ``op`` (``broadcast`` or ``all_gather``) of ``nbytes``: ``staged``,
        ``direct`` or ``measured`` (see ``torchcomms_shm.measured``), the tuner's (or the
        ``algorithm.<op>`` hint's) choice, where every rank can read its peers (else
        ``staged``). Every rank decides alike (agreed choices, equal sizes)."""
        st = self._st
        choice = tuning.choose(op, nbytes, torch.uint8).algorithm
        if choice == "staged" or not (st.cma_ok and st.size > 1 and nbytes > 0):
            return "staged"
        return choice

    def measured(
        self, op: str, nbytes: int, direct: Callable[[], None], staged: Callable[[], None]
    ) -> None:
        """Run ``direct`` or ``staged``, as rank 0's timings choose (``measured``): rank 0
        writes the choice into its control line before the step every rank posts first,
        and the others read it after that step."""
        st = self._st
        key = (op, (nbytes - 1).bit_length())
        w = st.words
        if st.rank != 0:
            st.sync()
            (direct if w[st.choice_of_0] == 2 else staged)()
            st.sync()
            return
        meter = self.meter
        use_direct = meter.pick(key)
        w[st.choice_of_0] = 2 if use_direct else 1
        start = time.perf_counter()
        st.sync()
        (direct if use_direct else staged)()
        # A closing step: the time is the slowest rank's. Without it a staged broadcast
        # from rank 0 timed only rank 0's copies in, and won against direct reads that
        # were faster for the readers.
        st.sync()
        meter.record(key, use_direct, time.perf_counter() - start)

    def broadcast_direct(self, data: torch.Tensor, root: int) -> None:
        """Every rank but ``root`` copies ``root``'s tensor straight into its own."""
        if self._st.rank == root:
            self._direct({}, [data])
        else:
            self._direct({root: (data, 0)}, [])

    def all_gather_direct(self, outs: list[torch.Tensor], mine: torch.Tensor) -> None:
        """Every rank copies each peer's block straight from the peer's input."""
        st = self._st
        me = st.rank
        self._direct({p: (outs[p], 0) for p in st.peers}, [mine], local_copy=(outs[me], mine))

    def all_to_all(
        self,
        outs: list[torch.Tensor],
        ins: list[torch.Tensor],
        tuning: Tuning,
        uniform: bool = False,
    ) -> None:
        """Block ``p`` of ``ins`` to rank ``p``, block ``p`` of ``outs`` from rank ``p``
        (uint8 tensors). ``uniform``: every block on every rank has one size
        (``all_to_all_single`` without splits), so every rank takes the same path from
        its own sizes (``tuning`` chooses it)."""
        st = self._st
        n, me = st.size, st.rank
        if n == 1:
            copy_to(outs[me], ins[me])
            return
        if (
            uniform
            and st.cma_ok
            and tuning.choose("all_to_all_single", outs[me].numel(), torch.uint8).algorithm
            == "direct"
        ):
            # Peer ``p`` reads entry ``p`` of this rank's table (its block of ``ins``).
            self._direct({p: (outs[p], me) for p in st.peers}, ins, local_copy=(outs[me], ins[me]))
            return
        region = st.chunk // (n - 1) // 64 * 64
        local = max(-(-t.numel() // region) for t in outs + ins)
        # The step count is announced in one of two words, by the parity of the first
        # step: a peer reaches a later step of that parity only after this rank posted the
        # step in between, which it does after reading the count.
        word = seg.W_COUNT + ((st.use + 1) & 1)
        count_word = st.layout.rank_word(me, word)
        peer_counts = [st.layout.rank_word(p, word) for p in st.peers]
        w = st.words
        w[count_word] = local  # read by the peers once they see this step
        k, steps = 0, 1
        while k < steps:
            lo = k * region
            h = st.half()
            mine = st.slots[me][h]
            for p in st.peers:
                m = min(region, ins[p].numel() - lo)
                if m > 0:
                    at = _place(p, me) * region
                    copy_to(mine[at : at + m], ins[p][lo : lo + m])
            st.post()
            m = min(region, outs[me].numel() - lo)
            if m > 0:  # this rank's own block, while the peers catch up
                copy_to(outs[me][lo : lo + m], ins[me][lo : lo + m])
            st.wait_peers()
            if k == 0:
                steps = max([local] + [w[i] for i in peer_counts])
            for p in st.peers:
                m = min(region, outs[p].numel() - lo)
                if m > 0:
                    at = _place(me, p) * region
                    copy_to(outs[p][lo : lo + m], st.slots[p][h][at : at + m])
            k += 1

    def _direct(
        self,
        reads: dict[int, tuple[torch.Tensor, int]],
        shares: list[torch.Tensor],
        local_copy: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """One copy per block, straight from the owner's tensor (cross-memory attach).

        This rank publishes the address and size of each tensor of ``shares`` (a table in
        its slot), copies ``local_copy`` (``(dst, src)``) while the peers catch up, reads
        ``reads[p] = (dst, entry)``: entry ``entry`` of peer ``p``'s table into ``dst``,
        and waits until every peer has read what it shared before returning (so the
        caller may change its tensors again).
        """
        st = self._st
        h = st.half()
        if shares:
            table = torch.tensor(
                [[t.data_ptr(), t.numel()] for t in shares], dtype=torch.int64
            ).view(torch.uint8)
            copy_to(st.slots[st.rank][h][: table.numel()], table.view(-1))
        st.post()
        if local_copy is not None and local_copy[0].data_ptr() != local_copy[1].data_ptr():
            copy_to(*local_copy)
        st.wait_peers()
        problem = ""
        try:
            for p, (dst, entry) in reads.items():
                addr, nbytes = (
                    st.slots[p][h][16 * entry : 16 * entry + 16].view(torch.int64).tolist()
                )
                if nbytes != dst.numel():
                    problem = problem or (
                        f"rank {p} sent {nbytes} bytes where this rank expects {dst.numel()}; "
                        f"every rank must pass matching sizes"
                    )
                    continue
                cma.read(st.pids[p], dst.data_ptr(), addr, nbytes)
        except CommOperationError as exc:
            raise st.fail(exc) from None
        st.sync()
        if problem:  # every rank finished the exchange: the communicator stays usable
            raise CommInputError(f"{st.op}: {problem}")


def _place(dst: int, owner: int) -> int:
    """Index of ``dst``'s region in ``owner``'s slot (one region per peer of ``owner``)."""
    return dst if dst < owner else dst - 1

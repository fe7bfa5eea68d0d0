"""``GlooBackend``: ``ProcessGroupGloo`` built directly on the communicator's store.

Never touches the global ``init_process_group``; each communicator owns its engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, ClassVar

import torch

from torchcomms_core.plugin import (
    Algorithm,
    C10dBackend,
    Choice,
    CommOptions,
    OpAlgorithms,
    Query,
    ReduceOp,
)

from . import fast_paths, loop_priority, teardown
from . import hints as gloo_hints
from .interface import engine_options, rendezvous_address
from .peer_addresses import EngineAddresses, RecordingStore


def _all_gather_rule(backend: Any, query: Query) -> str:
    """pairwise from 8 MiB of output, the engine's own below"""
    return "pairwise" if query.nbytes >= fast_paths.ALL_GATHER_MIN_BYTES else "engine"


def _reduce_scatter_rule(backend: Any, query: Query) -> Choice:
    """pairwise from 4 MiB of input (4 MiB pieces), the engine's own below"""
    if query.nbytes >= fast_paths.REDUCE_SCATTER_MIN_BYTES:
        return Choice("pairwise", {"piece_bytes": fast_paths.PIECE_BYTES})
    return Choice("engine")


_ENGINE = Algorithm("engine", doc="Gloo's own collective (stages through its buffers)")
_ALL_GATHER = OpAlgorithms(
    (
        _ENGINE,
        Algorithm("pairwise", doc="one send to and one receive from each peer, no staging"),
    ),
    default=_all_gather_rule,
)
_REDUCE_SCATTER = OpAlgorithms(
    (
        _ENGINE,
        Algorithm(
            "pairwise",
            {"piece_bytes": fast_paths.PIECE_BYTES},
            doc="pairwise transfers in pieces, reduced locally as they arrive",
        ),
    ),
    default=_reduce_scatter_rule,
)


class GlooBackend(C10dBackend):
    """CPU communicator on Gloo (TCP), single- or multi-host like torch itself."""

    #: The engine's collective or the pairwise fast path (``fast_paths``), by size (#45).
    algorithms: ClassVar[Mapping[str, OpAlgorithms]] = {
        "all_gather": _ALL_GATHER,
        "all_gather_single": _ALL_GATHER,
        "reduce_scatter": _REDUCE_SCATTER,
        "reduce_scatter_single": _REDUCE_SCATTER,
    }

    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    hint_keys: ClassVar[tuple[str, ...] | None] = gloo_hints.HINT_KEYS
    # Gloo has no uneven all-gather or reduce-scatter: the spec's defaults provide them
    # (``C10dBackend.engine_unsupported``).
    # Gloo's reductions have no int16 kernels ("Invalid scalar type"), so refuse it up front.
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int8,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    )

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_gloo_available():
            return False, "this PyTorch build has no Gloo support"
        return True, "ok"

    @classmethod
    def rendezvous_address(cls, hints: dict[str, str]) -> str | None:
        """The interface or hostname gloo binds to: a self-hosted rendezvous listens there."""
        return rendezvous_address(hints)

    def create_engine(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout: timedelta,
        device: torch.device,
        options: CommOptions,
    ) -> Any:
        from torch.distributed import ProcessGroupGloo

        lazy = self._lazy = gloo_hints.check(options.hints, size)
        nice = loop_priority.loop_nice(options.hints)
        self._addresses = EngineAddresses()
        self._recording: RecordingStore | None = None
        self._created: dict[int, str] = {}
        self.connections_at_creation = 0
        if size == 1:  # no peers, no connections to close on abort
            with loop_priority.lowered(nice):
                return ProcessGroupGloo(store, rank, size, engine_options(timeout, options.hints))
        if not lazy:
            before = teardown.socket_inodes()
            # Eagerly the full mesh is connected when the engine returns: record the sockets
            # that appeared meanwhile (a recorder would cost each build about 1 ms).
            with gloo_hints.engine_connects(lazy), loop_priority.lowered(nice):
                engine = ProcessGroupGloo(store, rank, size, engine_options(timeout, options.hints))
            self._created = teardown.engine_sockets(before, teardown.store_ports(store))
            self.connections_at_creation = len(self._created)
            return engine
        # Lazily the engine connects on first use, long after this: it talks to the store
        # through a recorder that notes its listener and, as it contacts them, the peers',
        # so abort can find (and wake) every connection it has then.
        recording = RecordingStore(store, self._addresses)
        with gloo_hints.engine_connects(lazy), loop_priority.lowered(nice):
            engine = ProcessGroupGloo(recording, rank, size, engine_options(timeout, options.hints))
        self._recording = recording  # the engine calls back into it: keep it alive
        if not self._addresses.complete:
            # Gloo's address values did not parse (not the layout of torch 2.13's gloo):
            # no connection is known (it connects later), so abort ends operations in
            # flight only at their timeout.
            self._created = {}
        # Peers the engine contacted while it was built (none, lazily). Counted from the
        # addresses it read rather than from /proc/self/fd: a process that hosts many
        # ranks (a simulation) would otherwise scan thousands of descriptors per build.
        self.connections_at_creation = len(self._addresses.snapshot()[1])
        return engine

    def init_waits_for_peers(self) -> bool:
        """An eager engine connected every peer at creation; a lazy one heard from none."""
        return not getattr(self, "_lazy", False)

    def peer_connections(self) -> dict[int, str]:
        """The engine's TCP connections to its peers open now (descriptor: inode)."""
        own, peers = getattr(self, "_addresses", EngineAddresses()).snapshot()
        found, _ = teardown.connections(set(own.values()), set(peers.values()))
        current = teardown.socket_inodes()
        found.update(
            (fd, inode)
            for fd, inode in getattr(self, "_created", {}).items()
            if current.get(fd) == inode  # recorded at creation and still open
        )
        return found

    def abort(self) -> None:
        """Abort the engine and close its connections, so nothing waits for a peer."""
        # Connections first: dropping the engine joins its worker threads, which must no
        # longer be blocked on a peer by then.
        recording = getattr(self, "_recording", None)
        if recording is not None:
            # Lazy: the recorder refuses the engine's further reads first, so it starts no
            # connection after this; then its connections are shut down and any pair
            # waiting for a peer to connect is woken.
            recording.close()
            teardown.close_lazy_engine(self._addresses)
        teardown.shut_down(getattr(self, "_created", {}))
        super().abort()

    def reconfigure_engine(
        self, store: Any, rank: int, size: int, timeout: timedelta, options: CommOptions
    ) -> None:
        """A fresh ``ProcessGroupGloo`` over the uuid-scoped store the core passes."""
        self._rank, self._size = rank, size
        self._opts_cache.clear()
        self._engine = self.create_engine(store, rank, size, timeout, self.device, options)

    def get_backend_name(self) -> str:
        return "gloo"

    def recv_anysource(
        self,
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
        tag: int = 0,
    ) -> Any:
        """Gloo's own any-source receive; the work's ``source_rank()`` names the sender."""
        from .anysource import AnySourceWork

        return AnySourceWork(self._engine.recv_anysource([tensor], tag), timeout)

    # Gloo matches a receive to a send by (peer, tag): both go to the engine unchanged.

    def send_tagged(
        self,
        tensor: torch.Tensor,
        dst: int,
        tag: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Send under ``tag``: only gloo's receive with that tag matches it."""
        return self._done(self._engine.send([tensor], dst, tag), async_op, timeout)

    def recv_tagged(
        self,
        tensor: torch.Tensor,
        src: int,
        tag: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Receive the message ``src`` sent under ``tag``."""
        return self._done(self._engine.recv([tensor], src, tag), async_op, timeout)

    def new_window(self) -> Any:
        """A window engine: shared memory, or the transport between ranks that share none
        (see ``torchcomms_gloo.window``)."""
        from .window import GlooWindowEngine

        self._windows_made = getattr(self, "_windows_made", 0) + 1
        return GlooWindowEngine(self, self._windows_made)

    # -- pairwise all-gather and reduce-scatter (fast_paths), above the crossover size --

    def all_gather_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        if (
            self.tuning.choose("all_gather_single", output.nbytes, output.dtype).algorithm
            == "engine"
        ):
            return super().all_gather_single(output, input, async_op, timeout=timeout, hints=hints)
        outputs = output.view(-1).chunk(self._size)
        work = fast_paths.all_gather(
            self._engine, self._rank, self._size, outputs, input.view(-1), timeout
        )
        return self._settle_pairwise(work, async_op)

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        choice = self.tuning.choose("all_gather", tensor.nbytes * self._size, tensor.dtype)
        if choice.algorithm == "engine":
            return super().all_gather(tensor_list, tensor, async_op, timeout=timeout, hints=hints)
        outputs = [t.view(-1) for t in tensor_list]
        work = fast_paths.all_gather(
            self._engine, self._rank, self._size, outputs, tensor.view(-1), timeout
        )
        return self._settle_pairwise(work, async_op)

    def reduce_scatter_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        choice = self.tuning.choose("reduce_scatter_single", input.nbytes, input.dtype)
        if choice.algorithm == "engine" or not fast_paths.reduces_natively(op, input.dtype):
            return super().reduce_scatter_single(
                output, input, op, async_op, timeout=timeout, hints=hints
            )
        work = fast_paths.reduce_scatter(
            self._engine,
            self._rank,
            self._size,
            output.view(-1),
            input.view(-1).chunk(self._size),
            op,
            timeout,
            self._scratch,
            int(choice.params["piece_bytes"]),
        )
        return self._settle_pairwise(work, async_op)

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        choice = self.tuning.choose("reduce_scatter", output.nbytes * self._size, output.dtype)
        if choice.algorithm == "engine" or not fast_paths.reduces_natively(op, output.dtype):
            return super().reduce_scatter(
                output, input_list, op, async_op, timeout=timeout, hints=hints
            )
        work = fast_paths.reduce_scatter(
            self._engine,
            self._rank,
            self._size,
            output.view(-1),
            [t.view(-1) for t in input_list],
            op,
            timeout,
            self._scratch,
            int(choice.params["piece_bytes"]),
        )
        return self._settle_pairwise(work, async_op)

    @property
    def _scratch(self) -> fast_paths.ScratchPool:
        pool = self.__dict__.get("_scratch_pool")
        if pool is None:
            pool = self.__dict__["_scratch_pool"] = fast_paths.ScratchPool()
        return pool

    @staticmethod
    def _settle_pairwise(work: fast_paths.PairwiseWork, async_op: bool) -> Any:
        if async_op:
            return work
        work.wait()
        return None

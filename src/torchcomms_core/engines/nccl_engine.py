"""The engine adapter of the backends on torch's ``ProcessGroupNCCL`` (ncclx, rccl).

:class:`NcclEngineBackend`: a :class:`~torchcomms_core.engines.c10d_engine.C10dBackend`
with CUDA stream semantics, NCCL's reductions (PREMUL_SUM on the device, bitwise ones
through the spec's defaults), memory registration, ``ncclCommSplit`` and reconfigure.
What the NCCL family shares besides the adapter (availability, devices, hints,
:class:`CudaWork`) is in ``cuda_support`` and re-exported here.

Imports: ``torch``, ``torchcomms_core.foundation``, ``torchcomms_core.operations``,
``torchcomms_core.spec``, ``engines.c10d_engine`` and ``engines.cuda_support``.
"""

from __future__ import annotations

import weakref
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from torchcomms_core.engines.c10d_engine import C10dBackend, c10d_module, to_c10d_reduce_op
from torchcomms_core.engines.cuda_support import (
    DEFAULT_EVENT_POOL_SIZE,
    HIGH_PRIORITY_STREAM,
    MAX_EVENT_POOL_SIZE,
    NCCL_CONFIG_FIELDS,
    NO_CUDA_REASON,
    PERSISTENT_STORE,
    CudaWork,
    apply_nccl_config,
    bind_device,
    check_hint_keys,
    cuda_allocator,
    cuda_unavailable_reason,
    nccl_available,
    nccl_config_hints,
    resolve_device,
    rocm_version,
)
from torchcomms_core.foundation.errors import CommInputError
from torchcomms_core.operations.hints import bool_hint, int_hint
from torchcomms_core.operations.reduce_op import RedOpType, ReduceOp
from torchcomms_core.spec import DEFAULT_DTYPES, TorchCommBackend

if TYPE_CHECKING:
    from torchcomms_core.operations.options import CommOptions

__all__ = [
    "DEFAULT_EVENT_POOL_SIZE",
    "HIGH_PRIORITY_STREAM",
    "MAX_EVENT_POOL_SIZE",
    "NCCL_CONFIG_FIELDS",
    "NCCL_DTYPES",
    "NO_CUDA_REASON",
    "PERSISTENT_STORE",
    "CudaWork",
    "NcclEngineBackend",
    "apply_nccl_config",
    "bind_device",
    "bool_hint",
    "check_hint_keys",
    "cuda_unavailable_reason",
    "nccl_available",
    "nccl_config_hints",
    "resolve_device",
    "rocm_version",
]

#: NCCL has no 16-bit integer type, so c10d refuses int16 tensors.
NCCL_DTYPES: tuple[torch.dtype, ...] = tuple(d for d in DEFAULT_DTYPES if d != torch.int16)

#: Element types NCCL can pre-multiply (``ncclRedOpCreatePreMulSum``).
_PREMUL_DTYPES = frozenset({torch.float16, torch.float32, torch.float64, torch.bfloat16})
_BITWISE = frozenset({RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR})


def _scaled(t: torch.Tensor, factor: float | torch.Tensor) -> torch.Tensor:
    """``t * factor`` in ``t``'s dtype, for dtypes NCCL cannot pre-multiply."""
    if isinstance(factor, torch.Tensor):
        factor = factor.to(t.device).reshape(())
    return (t * factor).to(t.dtype)


# -- the engine adapter ------------------------------------------------------------------


class NcclEngineBackend(C10dBackend):
    """A communicator on torch's ``ProcessGroupNCCL`` (NCCL on CUDA builds, RCCL on ROCm).

    Subclasses set ``hint_prefix`` and implement ``is_available`` and
    ``get_backend_name``. Every operation is queued on the engine's internal stream in
    issue order; nothing here blocks the host except ``barrier`` and ``wait_blocking``.
    """

    devices: ClassVar[tuple[str, ...]] = ("cuda",)
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = NCCL_DTYPES
    # SUM..MAX, AVG and PREMUL_SUM run in NCCL; NCCL has no bitwise reductions, so
    # BAND/BOR/BXOR gather the inputs and reduce them locally (the spec's defaults).
    supported_reduce_ops: ClassVar[frozenset[RedOpType]] = frozenset(RedOpType)
    # NCCL gathers and reduce-scatters uneven blocks itself (grouped broadcasts/reduces).
    engine_unsupported: ClassVar[frozenset[str]] = frozenset()
    coalesce_p2p: ClassVar[bool] = True
    # Its works' wait() orders streams; wait_blocking() blocks the host.
    supports_wait_blocking: ClassVar[bool] = True
    #: Namespace of this backend's hints, e.g. ``"ncclx"`` for ``ncclx.register_memory``.
    hint_prefix: ClassVar[str] = "nccl"
    #: Hint names (after ``<prefix>.``) this backend reads.
    known_hints: ClassVar[tuple[str, ...]] = ("high_priority_stream", "register_memory")
    hint_keys: ClassVar[tuple[str, ...] | None] = (
        HIGH_PRIORITY_STREAM,
        MAX_EVENT_POOL_SIZE,
        PERSISTENT_STORE,
        "nccl::*",
        "nccl.high_priority_stream",
        "nccl.register_memory",
    )

    # Live communicators of each backend class, for the process-wide allocator.
    _live: ClassVar[weakref.WeakSet[NcclEngineBackend]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._live = weakref.WeakSet()
        if "hint_keys" not in cls.__dict__:
            cls.hint_keys = (
                HIGH_PRIORITY_STREAM,
                MAX_EVENT_POOL_SIZE,
                PERSISTENT_STORE,
                f"{cls.hint_prefix}::*",
                *(f"{cls.hint_prefix}.{k}" for k in cls.known_hints),
            )

    def __init__(self) -> None:
        super().__init__()
        self._global_ranks: list[int] | None = None
        self._split_source: tuple[Any, int] | None = None
        self._group_name = ""
        #: The NCCL-registered memory pool (hint ``<prefix>.register_memory=true``).
        self.mem_pool: Any = None
        self.max_event_pool_size = DEFAULT_EVENT_POOL_SIZE
        self._config_hints: list[tuple[str, str, Any]] = []

    # -- engine ----------------------------------------------------------------------

    @classmethod
    def engine_class(cls) -> Any:
        """The c10d engine type (``torch.distributed.ProcessGroupNCCL``)."""
        from torch.distributed import ProcessGroupNCCL

        return ProcessGroupNCCL

    def hint(self, hints: dict[str, str], name: str, default: bool) -> bool:
        """Read the boolean hint ``<hint_prefix>.<name>`` (``"nccl.<name>"``).

        Args:
            hints: the hints to read from (the communicator's or a call's).
            name: the key without the prefix.
            default: the value when the key is absent.

        Raises:
            CommInputError: the value is not a boolean (``true``/``false``, ``1``/``0``, ...).
        """
        return bool_hint(hints, f"{self.hint_prefix}.{name}", default)

    def config_hints(self, hints: dict[str, str]) -> list[tuple[str, str, Any]]:
        """The hints that set fields of NCCL's config, as ``(hint key, NCCLConfig
        attribute, value)``: ``<hint_prefix>::<field>`` here; a backend with another
        scheme (ncclx: the fields' own names) overrides this.

        Raises:
            CommInputError: a field NCCL's config does not have, or a bad value.
        """
        return nccl_config_hints(hints, self.hint_prefix)

    def init(self, device: torch.device, name: str, options: CommOptions) -> None:
        check_hint_keys(options.hints, self.hint_prefix, self.known_hints)
        hints = options.hints
        #: The reference's CUDA event pool bound. torch's NCCL engine keeps its own events
        #: (one pair per work), so it is validated and kept but sets no engine limit.
        self.max_event_pool_size = int_hint(
            hints, MAX_EVENT_POOL_SIZE, DEFAULT_EVENT_POOL_SIZE, minimum=1
        )
        # The store passed is always used directly and kept (split needs it): what the
        # reference does with persistent_store=true; the value is checked, not needed.
        bool_hint(hints, PERSISTENT_STORE, True)
        self._config_hints = self.config_hints(hints)
        device = resolve_device(device, options.rank)
        bind_device(device)
        self.device = device
        if self._global_ranks is None:
            self._global_ranks = list(range(options.size))
        if not self._group_name:
            self._group_name = name
        super().init(device, name, options)
        type(self)._live.add(self)
        if self.hint(options.hints, "register_memory", False):
            try:
                self.mem_pool = torch.cuda.MemPool(self._engine_allocator())
                self._engine.register_mem_pool(self.mem_pool)
            except (AttributeError, RuntimeError) as exc:
                self.mem_pool = None
                self.abort()
                raise CommInputError(
                    f"hint {self.hint_prefix}.register_memory=true: this engine cannot "
                    f"register memory with NCCL ({exc}); drop the hint"
                ) from exc

    def create_engine(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout: timedelta,
        device: torch.device,
        options: CommOptions,
    ) -> Any:
        engine_cls = self.engine_class()
        opts = engine_cls.Options()
        opts._timeout = timeout
        # The reference's key (new_comm(is_high_priority_stream=True) sets it), else
        # our earlier namespaced one.
        opts.is_high_priority_stream = bool_hint(
            options.hints,
            HIGH_PRIORITY_STREAM,
            self.hint(options.hints, "high_priority_stream", False),
        )
        if self._config_hints:
            apply_nccl_config(opts.config, self._config_hints)
        opts.global_ranks_in_group = list(self._global_ranks or range(size))
        opts.group_name = self._group_name
        if self._split_source is not None:
            opts.split_from, opts.split_color = self._split_source
        engine = engine_cls(store, rank, size, opts)
        # Eager init: the NCCL communicator exists (or was split) before new_comm returns,
        # so a bad setup fails here rather than inside the first collective.
        engine.eager_connect_single_device(device)
        return engine

    def _engine_allocator(self) -> Any:
        engine = self._engine
        if engine is None:
            return None
        try:
            return engine.mem_allocator
        except (AttributeError, RuntimeError):  # NCCL built without ncclMemAlloc
            return None

    def finalize(self) -> None:
        type(self)._live.discard(self)
        pool, self.mem_pool = self.mem_pool, None
        if pool is not None and self._engine is not None:
            try:
                self._engine.deregister_mem_pool(pool)
            except RuntimeError:
                pass  # the engine is already broken; shutdown below still releases it
        super().finalize()

    # -- memory ----------------------------------------------------------------------

    def get_mem_allocator(self) -> Any:
        """Allocator for communication buffers: NCCL's (``ncclMemAlloc``) when the engine
        has one, else torch.cuda's current allocator."""
        native = self._engine_allocator()
        if native is not None:
            return native
        return cuda_allocator(self.get_backend_name())

    @classmethod
    def process_mem_allocator(cls) -> Any:
        """The process-wide allocator (``torchcomms.get_mem_allocator(name)``): NCCL's,
        taken from a live communicator of this backend when its engine has one, else
        torch.cuda's current allocator. NCCL's allocator is one per process, so any
        communicator gives the same one."""
        for backend in list(cls._live):
            native = backend._engine_allocator()
            if native is not None:
                return native
        return cuda_allocator(cls.hint_prefix)

    def register_mem_pool(self, pool: Any) -> None:
        """Register a ``torch.cuda.MemPool``'s memory with NCCL (zero-copy collectives)."""
        self._engine.register_mem_pool(pool)

    def deregister_mem_pool(self, pool: Any) -> None:
        """Withdraw a ``torch.cuda.MemPool`` registered with :meth:`register_mem_pool` from NCCL."""
        self._engine.deregister_mem_pool(pool)

    def allocate_tensor(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A 1-D tensor in communication-optimised memory when the engine offers it."""
        engine = self._engine
        if engine is not None and engine.supports_tensor_alloc(self.device):
            tensor: torch.Tensor = engine.allocate_tensor(numel, dtype=dtype, device=self.device)
            return tensor
        return torch.empty(numel, dtype=dtype, device=self.device)

    # -- completion ------------------------------------------------------------------

    def _done(self, work: Any, async_op: bool, timeout: timedelta | None, keep: Any = None) -> Any:
        if work is None:
            return None
        if async_op:
            return CudaWork((work,), timeout, keep)
        # No timeout on purpose: the current stream waits, the host does not. The
        # engine's watchdog still enforces the operation's timeout (set in its options).
        work.wait()
        return None

    def _done_all(self, works: list[Any], async_op: bool, timeout: timedelta | None) -> Any:
        if async_op:
            return CudaWork(works, timeout)
        for work in works:
            work.wait()
        return None

    # -- reconfigure (fault tolerance) ------------------------------------------------

    @classmethod
    def reconfigure_support(cls) -> tuple[bool, str]:
        """Checked at run time: this torch build's c10d must offer ``ProcessGroupNCCL`` with
        ``abort`` (``ncclCommAbort``, so the old communicator is retired without waiting for
        a dead peer) and eager init (``eager_connect_single_device``)."""
        try:
            engine_cls = cls.engine_class()
        except ImportError:
            return False, (
                f"this PyTorch build (torch {torch.__version__}) has no ProcessGroupNCCL in c10d"
            )
        missing = [
            m for m in ("abort", "eager_connect_single_device") if not hasattr(engine_cls, m)
        ]
        if missing:
            return False, (
                f"this PyTorch build's ProcessGroupNCCL (torch {torch.__version__}) lacks "
                f"{', '.join(missing)}"
            )
        return True, "ok"

    def reconfigure_engine(
        self, store: Any, rank: int, size: int, timeout: timedelta, options: CommOptions
    ) -> None:
        """A fresh NCCL communicator over exactly the new members; the core has aborted the
        previous one and namespaced ``store`` by the uuid."""
        check_hint_keys(options.hints, self.hint_prefix, self.known_hints)
        if self.device.index is None:
            self.device = resolve_device(self.device, rank)
        bind_device(self.device)
        self._rank, self._size = rank, size
        self._global_ranks = list(range(size))
        self._split_source = None
        self._opts_cache.clear()
        self._engine = self.create_engine(store, rank, size, timeout, self.device, options)

    # -- split -----------------------------------------------------------------------

    def split(self, ranks: list[int], name: str, options: CommOptions) -> TorchCommBackend | None:
        """Split with ``ncclCommSplit``; every parent rank takes part, non-members with ``[]``."""
        engine = self._engine
        if engine is None or not getattr(engine, "supports_splitting", False):
            return TorchCommBackend.split(self, ranks, name, options)
        if not ranks:
            engine.perform_nocolor_split(self.device)
            return None
        child = type(self)()
        parent_ranks = self._global_ranks or list(range(self._size))
        child._global_ranks = [parent_ranks[r] for r in ranks]
        # Groups of one split are disjoint, so their smallest members are distinct colors.
        child._split_source = (engine, min(ranks))
        child._group_name = f"{self._group_name}/{name}"
        child._bind(self.device, name, options)
        child.init(self.device, name, options)
        return child

    # -- reductions ------------------------------------------------------------------

    @staticmethod
    def _premul_in_python(op: ReduceOp, tensor: torch.Tensor) -> bool:
        return op.type is RedOpType.PREMUL_SUM and tensor.dtype not in _PREMUL_DTYPES

    def _reduction(self, op: ReduceOp, tensor: torch.Tensor) -> tuple[Any, Any]:
        """The c10d op for ``op`` on ``tensor`` and what must outlive the operation."""
        if op.type is RedOpType.AVG and tensor.dtype == torch.bool:
            # c10d refuses AVG on bools; the mean cast back to bool is "any", i.e. MAX.
            return to_c10d_reduce_op(ReduceOp.MAX), None
        if op.type is RedOpType.PREMUL_SUM:
            factor = op.factor
            if isinstance(factor, torch.Tensor):
                # NCCL reads a device-side factor of the data's type while the kernel runs.
                factor = factor.detach().to(device=tensor.device, dtype=tensor.dtype)
                return c10d_module()._make_nccl_premul_sum(factor), factor
            return c10d_module()._make_nccl_premul_sum(float(factor)), None  # type: ignore[arg-type]
        return to_c10d_reduce_op(op), None

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        if op.type in _BITWISE:
            return TorchCommBackend.all_reduce(
                self, tensor, op, async_op, timeout=timeout, hints=hints
            )
        if self._premul_in_python(op, tensor):
            tensor.copy_(_scaled(tensor, op.factor))  # type: ignore[arg-type]
            op = ReduceOp.SUM
        red, keep = self._reduction(op, tensor)
        opts = self._opts("AllreduceOptions", timeout, reduceOp=red)
        return self._done(self._engine.allreduce([tensor], opts), async_op, timeout, keep)

    def reduce(
        self,
        tensor: torch.Tensor,
        root: int,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        if op.type in _BITWISE:
            return TorchCommBackend.reduce(
                self, tensor, root, op, async_op, timeout=timeout, hints=hints
            )
        if self._premul_in_python(op, tensor):
            scaled = _scaled(tensor, op.factor)  # type: ignore[arg-type]
            # Only the root's tensor is an output; elsewhere it is the caller's input.
            tensor = tensor.copy_(scaled) if self._rank == root else scaled
            op = ReduceOp.SUM
        red, keep = self._reduction(op, tensor)
        opts = self._opts("ReduceOptions", timeout, rootRank=root, rootTensor=0, reduceOp=red)
        return self._done(self._engine.reduce([tensor], opts), async_op, timeout, keep)

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
        if op.type in _BITWISE:
            return TorchCommBackend.reduce_scatter_v(
                self, output, input_list, op, async_op, timeout=timeout, hints=hints
            )
        if self._premul_in_python(op, output):
            input_list = [_scaled(t, op.factor) for t in input_list]  # type: ignore[arg-type]
            op = ReduceOp.SUM
        red, keep = self._reduction(op, output)
        opts = self._opts("ReduceScatterOptions", timeout, reduceOp=red)
        work = self._engine.reduce_scatter([output], [input_list], opts)
        return self._done(work, async_op, timeout, keep)

    def reduce_scatter_v(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self.reduce_scatter(output, input_list, op, async_op, timeout=timeout, hints=hints)

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
        if op.type in _BITWISE:
            return TorchCommBackend.reduce_scatter_single(
                self, output, input, op, async_op, timeout=timeout, hints=hints
            )
        if self._premul_in_python(op, output):
            input = _scaled(input, op.factor)  # type: ignore[arg-type]
            op = ReduceOp.SUM
        red, keep = self._reduction(op, output)
        opts = self._opts("ReduceScatterOptions", timeout, reduceOp=red)
        work = self._engine._reduce_scatter_base(output, input, opts)
        return self._done(work, async_op, timeout, keep)

    # -- gathers and the rest --------------------------------------------------------

    def all_gather_v(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self.all_gather(tensor_list, tensor, async_op, timeout=timeout, hints=hints)

    def barrier(
        self,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        # Name the device: NCCL would otherwise guess it from the rank.
        opts = self._opts("BarrierOptions", timeout, device_ids=[self.device.index])
        return self._done(self._engine.barrier(opts), async_op, timeout)

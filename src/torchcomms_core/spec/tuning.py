"""Algorithms and tuners: what a backend may choose between, and who chooses (#45).

A backend declares, per operation, the algorithms it has (:class:`Algorithm`: a name, the
parameters it takes with their defaults, a line of doc) and its default rule, in the class
attribute ``TorchCommBackend.algorithms`` (``{op: OpAlgorithms}``). On its hot path it
asks ``self.tuning.choose(op, nbytes, dtype)`` and gets a :class:`Choice` (algorithm and
complete parameters). The core builds one :class:`Tuning` per communicator: it answers
from a cache per ``(op, size bucket, dtype)``, filled on a miss by, in order,

1. a hint that forces the algorithm (``algorithm.<op>=<name>``, ``algorithm.<op>.<param>``),
   or a backend hint the declaration lists in ``forced_by`` (the backend's default rule
   then decides, reading that hint);
2. the communicator's tuner (a :class:`Tuner` plugin, ``torchcomms.tuners``), when every
   rank agreed on it at creation;
3. the backend's default rule.

A tuner that raises or answers something the backend does not have is reported once and
the default rule decides: choosing never fails a call.

The size bucket of ``nbytes`` is the next power of two (``2 ** (nbytes - 1).bit_length()``);
the :class:`Query` a tuner or a default rule sees carries that bucket, never the exact
size, so every call of a bucket gets one answer on every rank.

Imports ``torch`` and ``foundation`` only.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import torch

from torchcomms_core.foundation.errors import CommInputError

__all__ = [
    "TUNER_SPEC_VERSION",
    "Algorithm",
    "Choice",
    "OpAlgorithms",
    "Query",
    "Tuner",
    "TunerContext",
    "Tuning",
    "TuningWarning",
    "size_bucket",
]

#: Version of the tuner spec; a tuner declares the version it targets in ``spec_version``.
TUNER_SPEC_VERSION = "1.0"

#: A parameter's value: what a JSON table can hold and a hint can spell.
ParamValue = int | float | str | bool


def _weak(owner: Any) -> Callable[[], Any]:
    """A reference to the backend instance a tuning asks its default rules with, that does
    not keep it alive: the backend holds its tuning (and its options hold it too), and a
    cycle would keep a finalized backend, and the store server it may host, alive until the
    cyclic collector runs (peers then wait for a rank that has left)."""
    try:
        return weakref.ref(owner)
    except TypeError:  # not weakly referenceable (None, a slotted object)
        return lambda: owner


class TuningWarning(RuntimeWarning):
    """A tuner failed, answered nonsense, or ranks disagreed: the default rules decide."""


def size_bucket(nbytes: int) -> int:
    """The bucket ``nbytes`` falls in: the next power of two (1 for 0 and 1 byte)."""
    return 1 << (nbytes - 1).bit_length() if nbytes > 1 else 1


def _frozen(params: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(params or {}))


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One algorithm of an operation: its name, its parameters with defaults, a line of doc."""

    #: The algorithm's name, unique among the operation's.
    name: str
    #: Each parameter it takes, with its default (an int, float, str or bool).
    params: Mapping[str, ParamValue] = dataclasses.field(default_factory=dict)
    #: One line saying what it does (``torchcomms backends --algorithms`` shows it).
    doc: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "=" in self.name:
            raise ValueError(f"Algorithm: name must be a non-empty string, got {self.name!r}")
        object.__setattr__(self, "params", _frozen(self.params))

    def describe(self) -> dict[str, Any]:
        """``{"name", "params", "doc"}``, as ``method_support`` and the CLI list it."""
        return {"name": self.name, "params": dict(self.params), "doc": self.doc}


@dataclasses.dataclass(frozen=True)
class Choice:
    """An answer: the algorithm's name and its parameters (the declared defaults fill
    whatever a tuner leaves out)."""

    algorithm: str
    params: Mapping[str, ParamValue] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _frozen(self.params))

    def __str__(self) -> str:
        if not self.params:
            return self.algorithm
        inner = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.algorithm}({inner})"

    def __hash__(self) -> int:
        return hash((self.algorithm, tuple(sorted(self.params.items()))))


@dataclasses.dataclass(frozen=True)
class Query:
    """What a tuner and a default rule are asked about: one operation at one size bucket.

    ``nbytes`` is the bucket (a power of two) of the bytes of the call's largest tensor
    argument on this rank (a list of tensors counts as their sum); ``world_size`` and
    ``ranks_per_host`` are the communicator's (the most ranks any host has, the same on
    every rank); ``backend`` is the backend's name, ``device`` the device type.
    """

    op: str
    nbytes: int
    dtype: torch.dtype
    world_size: int
    ranks_per_host: int
    backend: str
    device: str


#: A default rule: ``rule(backend instance, query)`` answers a Choice or an algorithm name.
DefaultRule = Callable[[Any, Query], "Choice | str"]


@dataclasses.dataclass(frozen=True)
class OpAlgorithms:
    """The algorithms of one operation and its default rule.

    ``default`` is an algorithm name (always that one), or a function ``rule(backend,
    query)`` returning a :class:`Choice` or a name; a backend method written in the class
    body works (``default=_default_all_reduce``). ``forced_by`` lists backend hints that,
    when the communicator has them, decide this operation instead of the tuner (the
    default rule reads them), e.g. shm's ``cma_bytes``; an entry ``"$NAME"`` stands for
    the environment variable ``NAME`` (set and not empty).
    """

    #: The algorithms the backend has for the operation.
    algorithms: tuple[Algorithm, ...]
    #: The default rule: an algorithm name, or ``rule(backend, query)``.
    default: str | DefaultRule
    #: Backend hints (``"$NAME"``: environment variables) that decide instead of a tuner.
    forced_by: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = [a.name for a in self.algorithms]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"OpAlgorithms: need distinct algorithm names, got {names}")
        if isinstance(self.default, str) and self.default not in names:
            raise ValueError(f"OpAlgorithms: default {self.default!r} is not one of {names}")

    def get(self, name: str) -> Algorithm | None:
        """The algorithm called ``name``, or ``None``."""
        for algorithm in self.algorithms:
            if algorithm.name == name:
                return algorithm
        return None

    def names(self) -> list[str]:
        """The algorithms' names, in declaration order."""
        return [a.name for a in self.algorithms]

    def complete(self, choice: Any) -> tuple[Choice | None, str]:
        """``(choice with every parameter, "")``, or ``(None, what is wrong with it)``.

        Refused: not a :class:`Choice`, an unknown algorithm, an undeclared parameter, a
        value of another type than the declared default's.
        """
        if not isinstance(choice, Choice):
            return None, f"{choice!r}, not a Choice or None"
        algorithm = self.get(choice.algorithm)
        if algorithm is None:
            return None, f"algorithm {choice.algorithm!r}, which is not one of {self.names()}"
        params = dict(algorithm.params)
        for key, value in choice.params.items():
            if key not in algorithm.params:
                declared = sorted(algorithm.params) or "none"
                return None, (
                    f"{choice}: {choice.algorithm!r} takes no parameter {key!r} "
                    f"(its parameters: {declared})"
                )
            want = type(algorithm.params[key])
            if type(value) is not want and not (want is float and type(value) is int):
                return None, f"{choice}: parameter {key!r} must be a {want.__name__}"
            params[key] = value
        return Choice(algorithm.name, params), ""

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description (``method_support``, ``torchcomms backends``)."""
        default = self.default if isinstance(self.default, str) else "rule"
        if not isinstance(self.default, str):
            doc = (getattr(self.default, "__doc__", None) or "").strip().split("\n\n")[0]
            default = " ".join(doc.split()) or getattr(self.default, "__name__", "rule")
        return {
            "algorithms": [a.describe() for a in self.algorithms],
            "default": default,
            "forced_by": list(self.forced_by),
        }


@dataclasses.dataclass(frozen=True)
class TunerContext:
    """What a tuner is told about the communicator it serves (its constructor's argument).

    ``algorithms`` is the backend's declaration; ``host`` this host's id
    (``TORCHCOMM_HOST_ID``, else the host name); ``hints`` the communicator's hints.
    ``ranks_per_host`` is not counted yet when a tuner is made (it holds the world size);
    each :class:`Query` carries the counted value.
    """

    backend: str
    backend_version: str
    world_size: int
    ranks_per_host: int
    host: str
    device: str
    algorithms: Mapping[str, OpAlgorithms]
    hints: Mapping[str, str] = dataclasses.field(default_factory=dict)


class Tuner(abc.ABC):
    """A tuner plugin: registered under the ``torchcomms.tuners`` entry-point group.

    The core makes one instance per communicator (``cls(context)``) and asks
    :meth:`choose` once per operation and size bucket; the answer is cached. Answer
    ``None`` to leave a query to the backend's default rule. Whatever :meth:`choose`
    raises or answers wrongly is reported once and replaced by the default rule.

    :meth:`fingerprint` names what the answers depend on (a table's digest): every rank
    of a communicator must publish the same fingerprint, else all of them use the
    default rules.
    """

    #: The tuner spec version this tuner targets.
    spec_version: ClassVar[str] = TUNER_SPEC_VERSION

    def __init__(self, context: TunerContext) -> None:
        self.context = context

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        """``(usable here, reason)``; the default says yes."""
        return True, "ok"

    @abc.abstractmethod
    def choose(self, query: Query) -> Choice | None:
        """The algorithm and parameters for ``query``, or ``None`` for the default rule."""

    def fingerprint(self) -> str:
        """What this tuner's answers depend on, equal on ranks that answer alike ("")."""
        return ""


_reported: set[tuple[str, ...]] = set()
_report_lock = threading.Lock()


def report_once(key: tuple[str, ...], message: str, stacklevel: int = 3) -> bool:
    """Warn ``message`` (a :class:`TuningWarning`) unless ``key`` was reported already."""
    with _report_lock:
        if key in _reported:
            return False
        _reported.add(key)
    warnings.warn(f"torchcomms: {message}", TuningWarning, stacklevel=stacklevel)
    return True


def _reset_reported() -> None:
    """Forget what was reported (tests)."""
    with _report_lock:
        _reported.clear()


def _parse(raw: str, like: ParamValue) -> ParamValue:
    if isinstance(like, bool):
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError("not a boolean")
    if isinstance(like, int):
        return int(raw.strip())
    if isinstance(like, float):
        return float(raw.strip())
    return raw


class Tuning:
    """One communicator's chooser: ``choose(op, nbytes, dtype)`` -> :class:`Choice`.

    Made by the core (``owner`` is the backend instance its default rules are asked with);
    a backend only calls :meth:`choose` (or :meth:`choose_hinted` with a call's hints) and
    reads :attr:`last`. A hit costs one tuple and one dict lookup.
    """

    __slots__ = (
        "_cache",
        "_ops",
        "_owner_ref",
        "_tuner",
        "_who",
        "_forced",
        "_hinted",
        "_query_base",
        "last",
        "status",
        "shared",
        "pending",
    )

    def __init__(
        self,
        owner: Any,
        algorithms: Mapping[str, OpAlgorithms],
        *,
        backend: str,
        world_size: int,
        ranks_per_host: int = 1,
        device: str = "cpu",
        hints: Mapping[str, str] | None = None,
    ) -> None:
        self._cache: dict[tuple[str, int, torch.dtype], Choice] = {}
        self._ops = dict(algorithms)
        self._owner_ref = _weak(owner)
        self._tuner: Tuner | None = None
        self._who = ""
        self._query_base = (world_size, ranks_per_host, backend, device)
        #: The last choice per operation (``torchcomms bench`` and the flight recorder).
        self.last: dict[str, Choice] = {}
        #: How choices are made, in words (``"default rules"``, ``"tuner 'x' (dist 1.0)"``).
        self.status = "default rules"
        #: Whether the ranks agreed through a shared store (else through the backend).
        self.shared = True
        #: The agreement still to finish once the engine is up (the core's), or ``None``.
        self.pending: Callable[[], None] | None = None
        hints = dict(hints or {})
        self._forced = self.forced_choices(hints, backend)
        # Operations a backend hint (or variable) decides through the default rule: the
        # tuner is not asked for them.
        self._hinted = frozenset(
            op
            for op, spec in self._ops.items()
            if any(
                (os.environ.get(k[1:], "").strip() != "") if k.startswith("$") else k in hints
                for k in spec.forced_by
            )
        )

    def forced_choices(self, hints: Mapping[str, str], backend: str) -> dict[str, Choice]:
        """The choices ``algorithm.<op>[.<param>]`` hints force, checked.

        Raises:
            CommInputError: a hint names an operation, algorithm or parameter the backend
                does not declare, or a value of the wrong type.
        """
        forced: dict[str, Choice] = {}
        for key, raw in hints.items():
            if not key.startswith("algorithm."):
                continue
            op, _, param = key[len("algorithm.") :].partition(".")
            spec = self._ops.get(op)
            if spec is None:
                declared = sorted(self._ops) or "none"
                raise CommInputError(
                    f"hint {key}={raw!r}: backend {backend!r} declares no algorithms for "
                    f"{op!r} (operations with algorithms: {declared}; `torchcomms backends "
                    f"--algorithms` lists them)"
                )
            if param:
                continue
            if spec.get(raw) is None:
                raise CommInputError(
                    f"hint {key}={raw!r}: backend {backend!r} has no {op} algorithm {raw!r}; "
                    f"choose one of {spec.names()}"
                )
            forced[op] = Choice(raw)
        for key, raw in hints.items():
            if not key.startswith("algorithm.") or key.count(".") < 2:
                continue
            op, param = key[len("algorithm.") :].split(".", 1)
            if op not in forced:
                raise CommInputError(
                    f"hint {key}={raw!r} sets a parameter but no algorithm; add the hint "
                    f"algorithm.{op}=<one of {self._ops[op].names()}>"
                )
            algorithm = self._ops[op].get(forced[op].algorithm)
            assert algorithm is not None
            if param not in algorithm.params:
                raise CommInputError(
                    f"hint {key}={raw!r}: {op} algorithm {algorithm.name!r} takes no parameter "
                    f"{param!r} (its parameters: {sorted(algorithm.params) or 'none'})"
                )
            try:
                value = _parse(raw, algorithm.params[param])
            except ValueError:
                like = type(algorithm.params[param]).__name__
                raise CommInputError(f"hint {key}={raw!r} must be a {like}") from None
            forced[op] = Choice(forced[op].algorithm, {**forced[op].params, param: value})
        return {op: self._ops[op].complete(c)[0] or c for op, c in forced.items()}

    def use(self, tuner: Tuner | None, who: str) -> None:
        """Ask ``tuner`` (described as ``who``, e.g. "tuner 'x' from dist 1.0") from now on."""
        self._tuner = tuner
        self._who = who
        self.status = who if tuner is not None else "default rules"
        self._cache.clear()

    def adopt(self, owner: Any) -> None:
        """Ask the default rules with backend instance ``owner`` (a split's child)."""
        self._owner_ref = _weak(owner)

    def rebase(self, world_size: int, ranks_per_host: int) -> None:
        """Ask about ``world_size`` ranks, ``ranks_per_host`` a host, from now on."""
        _, _, backend, device = self._query_base
        self._query_base = (world_size, ranks_per_host, backend, device)
        self._cache.clear()

    @property
    def tuner(self) -> Tuner | None:
        """The tuner asked on a cache miss, or ``None`` (default rules only)."""
        return self._tuner

    def choose(self, op: str, nbytes: int, dtype: torch.dtype) -> Choice:
        """The algorithm for ``op`` on ``nbytes`` bytes of ``dtype`` (cached per bucket).

        Raises:
            KeyError: the backend declares no algorithms for ``op`` (a backend bug).
        """
        try:
            choice = self._cache[op, (nbytes - 1).bit_length(), dtype]
        except KeyError:
            choice = self._fill(op, nbytes, dtype)
        self.last[op] = choice
        return choice

    def choose_hinted(
        self, op: str, nbytes: int, dtype: torch.dtype, hints: Mapping[str, str] | None
    ) -> Choice:
        """:meth:`choose`, with a call's ``algorithm.<op>`` hint winning when it has one."""
        if hints:
            name = hints.get("algorithm." + op)
            if name is not None:
                spec = self._ops[op]
                if spec.get(name) is None:
                    raise CommInputError(
                        f"hint algorithm.{op}={name!r}: no {op} algorithm {name!r}; choose "
                        f"one of {spec.names()}"
                    )
                params = {
                    k.rsplit(".", 1)[1]: v
                    for k, v in hints.items()
                    if k.startswith(f"algorithm.{op}.")
                }
                algorithm = spec.get(name)
                assert algorithm is not None
                typed = {}
                for key, raw in params.items():
                    if key not in algorithm.params:
                        raise CommInputError(
                            f"hint algorithm.{op}.{key}: {name!r} takes no parameter {key!r}"
                        )
                    typed[key] = _parse(raw, algorithm.params[key])
                choice = spec.complete(Choice(name, typed))[0]
                assert choice is not None
                self.last[op] = choice
                return choice
        return self.choose(op, nbytes, dtype)

    def query(self, op: str, nbytes: int, dtype: torch.dtype) -> Query:
        """The :class:`Query` of ``op`` on ``nbytes`` bytes (``nbytes`` becomes its bucket)."""
        world, per_host, backend, device = self._query_base
        return Query(op, size_bucket(nbytes), dtype, world, per_host, backend, device)

    def default(self, op: str, nbytes: int, dtype: torch.dtype) -> Choice:
        """The backend's default rule for ``op`` at ``nbytes`` (no tuner, no cache)."""
        spec = self._ops[op]
        rule = spec.default
        answer = (
            rule
            if isinstance(rule, str)
            else rule(self._owner_ref(), self.query(op, nbytes, dtype))
        )
        choice, problem = spec.complete(Choice(answer) if isinstance(answer, str) else answer)
        if choice is None:
            raise TypeError(f"the default rule of {op!r} answered {problem}")
        return choice

    def _fill(self, op: str, nbytes: int, dtype: torch.dtype) -> Choice:
        if op not in self._ops:
            raise KeyError(
                f"tuning: the backend asked for {op!r}, for which it declares no algorithms"
            )
        choice = self._forced.get(op)
        if choice is None and self._tuner is not None and op not in self._hinted:
            choice = self._ask(op, nbytes, dtype)
        if choice is None:
            choice = self.default(op, nbytes, dtype)
        self._cache[op, (nbytes - 1).bit_length(), dtype] = choice
        return choice

    def _ask(self, op: str, nbytes: int, dtype: torch.dtype) -> Choice | None:
        assert self._tuner is not None
        query = self.query(op, nbytes, dtype)
        fallback = "the default rule decides"
        try:
            answer = self._tuner.choose(query)
        except Exception as exc:
            report_once(
                (self._who, "raised"),
                f"{self._who} raised {type(exc).__name__}: {exc} when asked for {op} at "
                f"{query.nbytes} bytes of {dtype}; {fallback} (reported once)",
                stacklevel=5,
            )
            return None
        if answer is None:
            return None
        choice, problem = self._ops[op].complete(answer)
        if choice is None:
            report_once(
                (self._who, "answered", op),
                f"{self._who} answered {problem} for {op} at {query.nbytes} bytes on backend "
                f"{query.backend!r}; {fallback} (reported once)",
                stacklevel=5,
            )
        return choice

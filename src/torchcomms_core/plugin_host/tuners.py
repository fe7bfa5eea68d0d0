"""Tuner registry and each communicator's tuning: the fourth plugin kind (#45).

Tuners are found like backends and transports, on the plugin host's
:class:`~torchcomms_core.plugin_host.registry.EntryPointRegistry`, here over the
``torchcomms.tuners`` group; ``table`` (the built-in measuring tuner,
:mod:`.tuning_table`) is registered in-process. A communicator's tuner is its hint
``tuner``, else ``TORCHCOMM_TUNER``, else ``table``; ``none`` asks no tuner.

**Every rank takes the same choice.** :func:`make_tuning` runs at communicator creation,
before the backend's ``init``: each rank counts itself on its host and publishes its
tuner's fingerprint (distribution, version and the tuner's own :meth:`Tuner.fingerprint`,
e.g. the table's digest, with the ranks per host) through the communicator's store in a
fixed number of store operations (a ``compare_set`` against the first published one and
two join barriers), whatever the size. If any rank's fingerprint differs, every rank uses
the backend's default rules and warns once, naming the ranks that differ; creation never
fails for it. A communicator whose store is local to each process (mpi without
``MASTER_ADDR``) agrees the same way through two small ``all_gather_single`` calls of the
backend right after ``init`` (:func:`agree_after_init`).

Imports ``creation``, ``spec`` and ``foundation``.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.creation.join import join
from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import TorchCommError
from torchcomms_core.foundation.version import __version__
from torchcomms_core.plugin_host.backends import backend_version
from torchcomms_core.plugin_host.registry import EntryPointRegistry, PluginEntry, runs_here
from torchcomms_core.plugin_host.tuning_table import TableTuner
from torchcomms_core.spec.tuning import (
    TUNER_SPEC_VERSION,
    Tuner,
    TunerContext,
    Tuning,
    report_once,
)

__all__ = [
    "BUILTIN_TUNER",
    "TUNERS",
    "TUNERS_GROUP",
    "agree_after_init",
    "available_tuners",
    "describe_tuners",
    "get_tuner_class",
    "make_tuning",
    "register_tuner",
    "selected_tuner",
    "unregister_tuner",
]

#: The entry-point group tuner plugins register their class in.
TUNERS_GROUP = "torchcomms.tuners"
#: The tuner used when neither the hint ``tuner`` nor ``TORCHCOMM_TUNER`` names one.
BUILTIN_TUNER = "table"
#: The value of ``tuner``/``TORCHCOMM_TUNER`` that asks no tuner at all.
NO_TUNER = "none"

#: The tuners by name: in-process registrations, then the ``torchcomms.tuners`` group.
TUNERS: EntryPointRegistry[Tuner] = EntryPointRegistry(
    group=TUNERS_GROUP,
    kind="tuner",
    base=Tuner,
    base_name="torchcomms_core.plugin.Tuner",
    spec_version=TUNER_SPEC_VERSION,
    known_distributions={BUILTIN_TUNER: "torchcomms-core"},
    alternative=f", or set {_env.TUNER}={BUILTIN_TUNER} (the measured table) or {NO_TUNER}",
    docs="docs/writing-a-tuner.md",
    caller="new_comm",
)
TUNERS.register(BUILTIN_TUNER, TableTuner)


def register_tuner(name: str, tuner_class: type[Tuner]) -> None:
    """Register ``tuner_class`` as tuner ``name`` for this process (tests, notebooks)."""
    TUNERS.register(name, tuner_class, override=True)


def unregister_tuner(name: str) -> None:
    """Remove an in-process registration (entry points are unaffected)."""
    TUNERS.unregister(name)


def available_tuners() -> list[str]:
    """Names of the tuners registered in-process or installed as plugins."""
    return TUNERS.names()


def get_tuner_class(name: str) -> type[Tuner]:
    """The class of tuner ``name``, importing only its plugin.

    Raises:
        BackendNotFoundError: no tuner has that name.
        BackendLoadError: its plugin fails to import or is incompatible.
    """
    return TUNERS.get(name, stacklevel=4)


def selected_tuner(hints: dict[str, str] | None = None) -> str:
    """The tuner a communicator with ``hints`` asks: hint ``tuner``, ``TORCHCOMM_TUNER``,
    else ``table``; ``none`` for no tuner."""
    raw = (hints or {}).get("tuner", "").strip() or _env.tuner_choice() or BUILTIN_TUNER
    return raw


def _provider(name: str) -> str:
    """``"distribution version"`` of tuner ``name`` (the core's for in-process ones)."""
    if name == BUILTIN_TUNER:
        return f"torchcomms-core {__version__}"
    entry: PluginEntry | None = TUNERS.entry_points().get(name)
    if entry is not None:
        return entry.provider
    return "registered in-process"


def _load(name: str, context: TunerContext) -> tuple[Tuner | None, str, str]:
    """``(tuner instance or None, who, fingerprint)``; a tuner that cannot be had is reported
    once and stands as an unavailable fingerprint, so the other ranks see it differ."""
    if name == NO_TUNER:
        return None, "no tuner", NO_TUNER
    who = f"tuner {name!r} from {_provider(name)}"
    try:
        cls = get_tuner_class(name)
        ok, reason = runs_here(cls)
        if not ok:
            raise RuntimeError(f"it cannot run here: {reason}")
        tuner = cls(context)
        own = str(tuner.fingerprint())
    except Exception as exc:
        report_once(
            ("load", name),
            f"{who} is not used: {type(exc).__name__}: {exc}; the backend's default rules "
            f"decide (set {_env.TUNER}={NO_TUNER} to silence this)",
            stacklevel=6,
        )
        return None, who, f"unavailable:{name}"
    return tuner, f"{who} [{own}]" if own else who, f"{name}|{_provider(name)}|{own}"


def make_tuning(
    instance: Any,
    backend: str,
    device: torch.device,
    options: Any,
    *,
    shared_store: bool,
    what: str,
    claim_key: Any = None,
    claims: Any = None,
    members: Any = None,
) -> Tuning:
    """The :class:`Tuning` of a communicator about to be created (before ``init``).

    With ``shared_store`` the ranks agree on the tuner through ``options.store`` now;
    otherwise the tuning starts on the default rules and :func:`agree_after_init` agrees.

    Raises:
        CommTimeoutError: not every rank arrived within the timeout (naming the missing).
    """
    cls = type(instance)
    hints = dict(options.hints)
    size = max(int(options.size), 1)
    tuning = Tuning(
        instance,
        cls.algorithms,
        backend=backend,
        world_size=size,
        device=device.type,
        hints=hints,
    )
    tuning.shared = shared_store
    # A backend that does not communicate (``fake``) has no peers to agree with.
    communicates = getattr(cls, "communicates", True)
    if not cls.algorithms or (not shared_store and communicates):
        return tuning
    from torch._C._distributed_c10d import PrefixStore

    host = _env.host_id()
    store = PrefixStore("tuning", options.store)
    timeout: timedelta = options.timeout
    host_key = "host/" + hashlib.sha256(host.encode()).hexdigest()[:16]
    agree = size > 1 and communicates
    if agree:
        store.add(host_key, 1)
        join(PrefixStore("a", store), size, timeout, what, claim_key, claims, members)
        per_host = max(store.add(host_key, 0), 1)
    else:
        per_host = 1
    context = _context(cls, backend, size, per_host, host, device, hints)
    tuner, who, fingerprint = _load(selected_tuner(hints), context)
    if agree:
        mine = f"{fingerprint}|ranks_per_host={per_host}"
        first = _text(store.compare_set("fp", "", mine))
        if first != mine:
            store.set(f"differ/{options.rank}", mine)
            store.add("differ", 1)
        join(PrefixStore("b", store), size, timeout, what, claim_key, claims, members)
        if store.add("differ", 0):
            _disagree(backend, what, first, _differing(store, size))
            return _rebuilt(tuning, instance, backend, size, per_host, device, hints, None, "")
    return _rebuilt(tuning, instance, backend, size, per_host, device, hints, tuner, who)


def agree_after_init(tuning: Tuning, instance: Any, backend: str, device: torch.device) -> None:
    """Agree on the tuner through the backend itself (two ``all_gather_single`` calls),
    for a communicator without a shared store; then let ``tuning`` ask it."""
    cls = type(instance)
    if not cls.algorithms or not getattr(cls, "communicates", True):
        return
    size = int(instance.get_size())
    host = _env.host_id()
    hosts = _gather(instance, hashlib.sha256(host.encode()).digest()[:8], size)
    per_host = max(hosts.count(h) for h in hosts)
    hints = dict(instance.options.hints)
    context = _context(cls, backend, size, per_host, host, device, hints)
    tuner, who, fingerprint = _load(selected_tuner(hints), context)
    digests = _gather(instance, hashlib.sha256(fingerprint.encode()).digest()[:16], size)
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    if differ:
        _disagree(backend, f"communicator {instance.options.name!r}", "rank 0's", differ)
        tuner, who = None, ""
    tuning.rebase(size, per_host)
    tuning.use(tuner, who)


def _gather(instance: Any, payload: bytes, size: int) -> list[bytes]:
    inp = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    out = torch.empty(len(payload) * size, dtype=torch.uint8)
    work = instance.all_gather_single(out, inp, False)
    if work is not None:
        work.wait()
    raw = out.numpy().tobytes()
    n = len(payload)
    return [raw[i * n : (i + 1) * n] for i in range(size)]


def _context(
    cls: type[Any],
    backend: str,
    size: int,
    per_host: int,
    host: str,
    device: torch.device,
    hints: dict[str, str],
) -> TunerContext:
    return TunerContext(
        backend=backend,
        backend_version=backend_version(cls),
        world_size=size,
        ranks_per_host=per_host,
        host=host,
        device=device.type,
        algorithms=dict(cls.algorithms),
        hints=hints,
    )


def _rebuilt(
    tuning: Tuning,
    instance: Any,
    backend: str,
    size: int,
    per_host: int,
    device: torch.device,
    hints: dict[str, str],
    tuner: Tuner | None,
    who: str,
) -> Tuning:
    fresh = Tuning(
        instance,
        type(instance).algorithms,
        backend=backend,
        world_size=size,
        ranks_per_host=per_host,
        device=device.type,
        hints=hints,
    )
    fresh.use(tuner, who)
    return fresh


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


#: At most this many differing ranks are looked up and named.
NAMED = 16


def _differing(store: Any, size: int) -> list[int]:
    """The ranks (up to :data:`NAMED`) whose fingerprint differs from the first published."""
    found: list[int] = []
    for rank in range(size):
        if store.check([f"differ/{rank}"]):
            found.append(rank)
            if len(found) >= NAMED:
                break
    return found


def _disagree(backend: str, what: str, first: str, ranks: list[int]) -> None:
    listing = ", ".join(str(r) for r in ranks) or "some ranks"
    report_once(
        ("disagree", backend, what),
        f"{what} (backend {backend!r}): the ranks' tuners differ: rank(s) {listing} published "
        f"another fingerprint than the first one published ({first}), so every rank uses the "
        f"backend's default rules. Give every rank the "
        f"same {_env.TUNER} (or hint 'tuner') and the same tuning table "
        f"({_env.TUNING_DIR}), or run `torchcomms tune` again on each host",
        stacklevel=5,
    )


def describe_tuners() -> list[dict[str, Any]]:
    """One record per tuner: name, distribution, version, whether it is selected."""
    chosen = selected_tuner()
    entries = TUNERS.entry_points()
    rows = []
    for name in available_tuners():
        entry = entries.get(name)
        row: dict[str, Any] = {
            "name": name,
            "distribution": entry.distribution
            if entry
            else ("torchcomms-core" if name == BUILTIN_TUNER else "(registered in-process)"),
            "version": (entry.version or "") if entry else __version__,
            "entry_point": entry.value if entry else "",
            "selected": name == chosen,
        }
        try:
            runnable, reason = runs_here(get_tuner_class(name))
            row.update(runnable=runnable, reason="" if runnable else reason)
        except TorchCommError as exc:
            row.update(runnable=False, reason=f"failed: {exc}")
        rows.append(row)
    return rows

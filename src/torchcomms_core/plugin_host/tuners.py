"""Tuner registry and each communicator's tuning: the fourth plugin kind (#45).

Tuners are found like backends and transports, on the plugin host's
:class:`~torchcomms_core.plugin_host.registry.EntryPointRegistry`, here over the
``torchcomms.tuners`` group; ``table`` (the built-in measuring tuner,
:mod:`.tuning_table`) is registered in-process. A communicator's tuner is its hint
``tuner``, else ``TORCHCOMM_TUNER``, else ``table``; ``none`` asks no tuner.

**Every rank takes the same choice.** :func:`make_tuning` runs at communicator creation,
before the backend's ``init``. A rank whose tuner has nothing to say (``none``, or
``table`` without a table for this host) does nothing, and uses the default rules. A rank
with a tuner counts its fingerprint (the tuner's name, distribution and version and its
own :meth:`Tuner.fingerprint`, e.g. the table's digest) and its host in the store: three
store operations. Once the engine is up (its creation, or the core's join, waited until
every rank had begun), :func:`confirm_tuning` reads the count (two more): the tuner is used
only if every rank counted the same fingerprint; otherwise every rank with a tuner warns
once, naming the ranks that differ, and every rank runs on the default rules. Until then
(choices made inside ``init``) the default rules and hints decide. Creation never fails
and never waits for it; a job without tuners pays no store operation at all.

A communicator whose store is local to each process (mpi without ``MASTER_ADDR``) agrees
through two small ``all_gather_single`` calls of the backend right after ``init``
(:func:`agree_after_init`).

Imports ``spec`` and ``foundation``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.version import __version__
from torchcomms_core.plugin_host.backends import backend_version
from torchcomms_core.plugin_host.registry import (
    IN_PROCESS,
    ClassCheck,
    EntryPointRegistry,
    PluginEntry,
    runs_here,
)
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
    "confirm_tuning",
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
    check=ClassCheck(
        Tuner, TUNER_SPEC_VERSION, "torchcomms_core.plugin.Tuner", docs="docs/writing-a-tuner.md"
    ),
    known_distributions={BUILTIN_TUNER: "torchcomms-core"},
    alternative=f", or set {_env.TUNER}={BUILTIN_TUNER} (the measured table) or {NO_TUNER}",
    caller="new_comm",
)
TUNERS.register(BUILTIN_TUNER, TableTuner)


def register_tuner(name: str, tuner_class: type[Tuner]) -> None:
    """Register ``tuner_class`` as tuner ``name`` for this process (tests, notebooks)."""
    TUNERS.register(name, tuner_class, override=True)


def unregister_tuner(name: str) -> None:
    """Remove an in-process registration (entry points are unaffected)."""
    TUNERS.unregister(name)


#: Names of the tuners registered in-process or installed as plugins.
available_tuners = TUNERS.names
#: The class of tuner ``name``, importing only its plugin; raises ``BackendNotFoundError``
#: where no tuner has that name, ``BackendLoadError`` where its plugin fails to import or is
#: incompatible.
get_tuner_class = TUNERS.get


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
        if isinstance(tuner, TableTuner) and not tuner.rules:
            return None, "no tuner", NO_TUNER  # no table here: nothing to ask
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

    It answers the default rules (and forcing hints) until :func:`confirm_tuning`, called
    once the engine is up, has checked that every rank has the same tuner. A rank whose
    tuner answers nothing (``none``; ``table`` without a table) publishes nothing and uses
    no store operation; a rank with a tuner counts its fingerprint (and its host) in the
    store now. Without ``shared_store``, :func:`agree_after_init` agrees instead.
    """
    del claim_key, claims, members  # the engine's creation is the barrier (see module doc)
    cls = type(instance)
    hints = dict(options.hints)
    size = max(int(options.size), 1)
    tuning = Tuning(
        instance, cls.algorithms, backend=backend, world_size=size, device=device.type, hints=hints
    )
    tuning.shared = shared_store
    # A backend that does not communicate (``fake``) has no peers to agree with.
    communicates = getattr(cls, "communicates", True)
    if not cls.algorithms or (not shared_store and communicates):
        return tuning
    host = _env.host_id()
    context = _context(cls, backend, size, size if size > 1 else 1, host, device, hints)
    tuner, who, fingerprint = _load(selected_tuner(hints), context)
    if tuner is None and fingerprint == NO_TUNER:
        return tuning  # nothing to agree on: the default rules, as on a rank without tuner
    if size == 1 or not communicates:
        tuning.rebase(size, 1)
        tuning.use(tuner, who)
        return tuning
    from torch._C._distributed_c10d import PrefixStore

    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
    store = PrefixStore("tuning", options.store)
    host_key = "host/" + hashlib.sha256(host.encode()).hexdigest()[:16]
    store.add(f"fp/{digest}", 1)
    store.set(f"rank/{options.rank}", digest)
    store.add(host_key, 1)

    def confirm() -> None:
        # Every rank's init has begun by now (the engine's creation, or the core's join,
        # waited for it), so every rank with a tuner has counted itself.
        agreed = store.add(f"fp/{digest}", 0)
        per_host = max(store.add(host_key, 0), 1)
        if agreed != size:
            _disagree(backend, what, fingerprint, _differing(store, size, digest), agreed, size)
            return
        tuning.rebase(size, per_host)
        tuning.use(tuner, who)

    tuning.pending = confirm
    return tuning


def confirm_tuning(tuning: Tuning) -> None:
    """Finish what :func:`make_tuning` started, once the engine is up (every rank)."""
    confirm = tuning.pending
    tuning.pending = None
    if confirm is not None:
        confirm()


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
        agreed = size - len(differ)
        _disagree(
            backend, f"communicator {instance.options.name!r}", fingerprint, differ, agreed, size
        )
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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


#: At most this many differing ranks are looked up and named.
NAMED = 16


def _differing(store: Any, size: int, digest: str) -> list[int]:
    """The ranks (up to :data:`NAMED`) without this fingerprint (another one, or no tuner)."""
    found: list[int] = []
    for rank in range(size):
        key = f"rank/{rank}"
        if not store.check([key]) or _text(store.get(key)) != digest:
            found.append(rank)
            if len(found) >= NAMED:
                break
    return found


def _disagree(
    backend: str, what: str, fingerprint: str, ranks: list[int], agreed: int, size: int
) -> None:
    listing = ", ".join(str(r) for r in ranks) or "some ranks"
    report_once(
        ("disagree", backend, what),
        f"{what} (backend {backend!r}): the ranks' tuners differ: {agreed} of {size} ranks "
        f"have this one ({fingerprint}), rank(s) {listing} another or none, so every rank "
        f"uses the backend's default rules. Give every rank the same {_env.TUNER} (or hint "
        f"'tuner') and the same tuning table ({_env.TUNING_DIR}), or run `torchcomms tune` "
        f"again on each host",
        stacklevel=5,
    )


def describe_tuners() -> list[dict[str, Any]]:
    """One record per tuner: name, distribution, version, whether it runs here and whether
    it is the one communicators ask (``selected``)."""
    chosen = selected_tuner()

    def loaded(cls: type[Tuner]) -> dict[str, Any]:
        runnable, reason = runs_here(cls)
        return {"runnable": runnable, "reason": "" if runnable else reason}

    return TUNERS.describe(
        loaded,
        lambda exc: {"runnable": False, "reason": f"failed: {exc}"},
        about=lambda name, entry: {"selected": name == chosen},
        # In-process tuners come with the core's version; ``table`` is the core's own.
        in_process=lambda name: (
            "torchcomms-core" if name == BUILTIN_TUNER else IN_PROCESS,
            __version__,
        ),
    )

"""The hints of the ncclx backend, in the reference's current scheme.

- **NCCL's config**: a key named like a field of ``ncclConfig_t`` (``blocking``,
  ``cgaClusterSize`` or ``cga_cluster_size``, ``minCTAs``, ``maxCTAs``, ``netName``,
  ``splitShare``, ``trafficClass``, ``commName``, ``collnetEnable``, ``CTAPolicy``,
  ``shrinkShare``, ``nvlsCTAs``; snake_case spellings where the reference accepts them)
  sets that field, through torch's ``ProcessGroupNCCL.Options.config``.
- **NCCLX hints**: ``ncclx::<key>`` goes to NCCLX's own hints (``ncclx::Hints``), which
  torch's NCCL engine does not have: they are checked (``ncclx::commDesc`` and
  ``ncclx::splitGroupRanks`` are derived, never set), kept in ``ncclx_hints`` and reported
  with a warning, as the reference does where its NCCL has no NCCLX hints.
- **The communicator's**: ``is_high_priority_stream``, ``max_event_pool_size``,
  ``garbage_collect_interval_ms``, ``enable_cuda_graph_support``,
  ``graph_timeout_check_interval_ms`` (the reference's NCCLX keys), ``persistent_store``.
- **Deprecated**: the earlier prefixed form of a config field, ``ncclx::<field>``
  (``ncclx::cgaClusterSize``), still sets the field, with a :class:`DeprecationWarning`
  naming the unprefixed key.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from torchcomms_core.plugin import CommInputError, bool_hint, int_hint

#: The prefix of NCCLX's own hints.
NCCLX_PREFIX = "ncclx::"

#: ``ncclConfig_t`` fields: hint key -> (torch's ``NCCLConfig`` attribute, value type).
#: The snake_case aliases are those the reference accepts.
NCCL_CONFIG_FIELDS: dict[str, tuple[str, type]] = {
    "blocking": ("blocking", int),
    "cgaClusterSize": ("cga_cluster_size", int),
    "cga_cluster_size": ("cga_cluster_size", int),
    "minCTAs": ("min_ctas", int),
    "min_ctas": ("min_ctas", int),
    "maxCTAs": ("max_ctas", int),
    "max_ctas": ("max_ctas", int),
    "netName": ("net_name", str),
    "splitShare": ("split_share", int),
    "split_share": ("split_share", int),
    "trafficClass": ("traffic_class", int),
    "traffic_class": ("traffic_class", int),
    "commName": ("comm_name", str),
    "collnetEnable": ("collnet_enable", int),
    "collnet_enable": ("collnet_enable", int),
    "CTAPolicy": ("cta_policy", int),
    "cta_policy": ("cta_policy", int),
    "shrinkShare": ("shrink_share", int),
    "nvlsCTAs": ("nvls_ctas", int),
    "nvls_ctas": ("nvls_ctas", int),
}

#: The reference's NCCLX communicator keys and their defaults (milliseconds, bool).
GARBAGE_COLLECT_INTERVAL_MS = "garbage_collect_interval_ms"
ENABLE_CUDA_GRAPH_SUPPORT = "enable_cuda_graph_support"
GRAPH_TIMEOUT_CHECK_INTERVAL_MS = "graph_timeout_check_interval_ms"
DEFAULT_GARBAGE_COLLECT_INTERVAL_MS = 100
DEFAULT_GRAPH_TIMEOUT_CHECK_INTERVAL_MS = 1000

#: NCCLX hints the communicator derives itself; setting them is refused.
DERIVED_NCCLX_HINTS = {
    "ncclx::commDesc": "it is derived from the communicator's name",
    "ncclx::splitGroupRanks": "it is derived from the ranks passed to split",
}

#: The communicator's keys beside the config fields and ``ncclx::*`` (the first three are
#: read by the core's NCCL engine support, the others here).
LAYER_KEYS: tuple[str, ...] = (
    "is_high_priority_stream",
    "max_event_pool_size",
    "persistent_store",
    GARBAGE_COLLECT_INTERVAL_MS,
    ENABLE_CUDA_GRAPH_SUPPORT,
    GRAPH_TIMEOUT_CHECK_INTERVAL_MS,
)


class NcclxHintWarning(UserWarning):
    """An NCCLX hint (``ncclx::<key>``) was given that torch's NCCL engine cannot apply."""


@dataclasses.dataclass(frozen=True)
class NcclxHints:
    """What the hints of one communicator say."""

    #: ``(hint key, NCCLConfig attribute, value)`` for each config field set.
    config: list[tuple[str, str, Any]]
    #: The ``ncclx::*`` hints (NCCLX's own), as given.
    ncclx: dict[str, str]
    garbage_collect_interval_ms: int = DEFAULT_GARBAGE_COLLECT_INTERVAL_MS
    enable_cuda_graph_support: bool = True
    graph_timeout_check_interval_ms: int = DEFAULT_GRAPH_TIMEOUT_CHECK_INTERVAL_MS


def parse(hints: dict[str, str]) -> NcclxHints:
    """Sort and check the hints of an ncclx communicator (see the module's documentation).

    Raises:
        CommInputError: a config field's value of the wrong type, a derived NCCLX hint,
            or a layer key's value that is not a boolean or a non-negative integer.
    """
    config: list[tuple[str, str, Any]] = []
    ncclx: dict[str, str] = {}
    for key, raw in hints.items():
        if key in NCCL_CONFIG_FIELDS:
            config.append(_config_setting(key, key, raw))
        elif key.startswith(NCCLX_PREFIX):
            field = key[len(NCCLX_PREFIX) :]
            if field in NCCL_CONFIG_FIELDS:
                warnings.warn(
                    f"hint {key!r}: the prefixed form of an ncclConfig_t field is "
                    f"deprecated; pass {field!r} (the field's own name) instead",
                    DeprecationWarning,
                    stacklevel=4,
                )
                config.append(_config_setting(key, field, raw))
                continue
            why = DERIVED_NCCLX_HINTS.get(key)
            if why is not None:
                raise CommInputError(f"hint {key!r} must not be set: {why}; drop it")
            if not field:
                raise CommInputError(f"hint {key!r} names no NCCLX hint; pass 'ncclx::<name>'")
            ncclx[key] = raw
    return NcclxHints(
        config=config,
        ncclx=ncclx,
        garbage_collect_interval_ms=int_hint(
            hints, GARBAGE_COLLECT_INTERVAL_MS, DEFAULT_GARBAGE_COLLECT_INTERVAL_MS
        ),
        enable_cuda_graph_support=bool_hint(hints, ENABLE_CUDA_GRAPH_SUPPORT, True),
        graph_timeout_check_interval_ms=int_hint(
            hints, GRAPH_TIMEOUT_CHECK_INTERVAL_MS, DEFAULT_GRAPH_TIMEOUT_CHECK_INTERVAL_MS
        ),
    )


def warn_unapplied(ncclx: dict[str, str], name: str) -> None:
    """Say that torch's NCCL engine has no NCCLX hints to pass ``ncclx`` to."""
    if ncclx:
        keys = ", ".join(repr(k) for k in ncclx)
        warnings.warn(
            f"{f'communicator {name!r}: ' if name else ''}NCCLX hints ({keys}) have no "
            f"effect on torch's NCCL "
            f"engine, which has no NCCLX hints; they are kept in the backend's "
            f"ncclx_hints. NCCL's own config fields are set without the prefix "
            f"(e.g. 'cgaClusterSize')",
            NcclxHintWarning,
            stacklevel=4,
        )


def _config_setting(key: str, field: str, raw: str) -> tuple[str, str, Any]:
    attr, kind = NCCL_CONFIG_FIELDS[field]
    if kind is not int:
        return key, attr, raw
    try:
        return key, attr, int(raw.strip())
    except ValueError:
        raise CommInputError(
            f"hint {key}={raw!r}: ncclConfig_t.{field} is an integer; pass e.g. '4'"
        ) from None

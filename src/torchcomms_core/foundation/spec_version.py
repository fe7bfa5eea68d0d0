"""Whether a plugin's declared spec version runs on this core: one rule for every plugin kind.

Imports only ``foundation.errors``.
"""

from __future__ import annotations

from torchcomms_core.foundation.errors import BackendLoadError


def check_spec_version(declared: object, core: str, who: str, kind: str) -> None:
    """Raise :class:`BackendLoadError` unless ``declared`` (a plugin's ``spec_version``) can
    run on this core's ``core`` version of the ``kind`` spec: the same major, a minor no
    newer than the core's."""
    try:
        major, minor = (int(p) for p in str(declared).split(".")[:2])
    except ValueError:
        raise BackendLoadError(
            f"{who} declares spec_version={declared!r}; expected 'MAJOR.MINOR' such as {core!r}"
        ) from None
    core_major, core_minor = (int(p) for p in core.split("."))
    if major != core_major or minor > core_minor:
        hint = (
            "upgrade torchcomms-core"
            if (major, minor) > (core_major, core_minor)
            else f"upgrade the {kind} plugin"
        )
        raise BackendLoadError(
            f"{who} targets {kind} spec {declared}, but this torchcomms-core implements "
            f"{kind} spec {core}; {hint} so that both agree"
        )

"""torchcomms-nixl: the reference's transport API (one-sided write/read) on NIXL agents."""

from __future__ import annotations

import importlib.metadata as _metadata

from .transport import NixlEndpoint, NixlRegistration, NixlTransport

try:  # one version for every distribution: the core's _version.py, read at build time
    __version__ = _metadata.version("torchcomms-nixl")
except _metadata.PackageNotFoundError:  # imported from a source tree that is not installed
    __version__ = "0+unknown"
__all__ = ["NixlEndpoint", "NixlRegistration", "NixlTransport", "__version__"]

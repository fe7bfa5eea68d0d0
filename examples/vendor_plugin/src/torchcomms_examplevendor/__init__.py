"""torchcomms-examplevendor: a minimal backend plugin, as a vendor would ship it."""

from __future__ import annotations

from .backend import ExampleVendorBackend

__version__ = "0.1.0"
__all__ = ["ExampleVendorBackend", "__version__"]

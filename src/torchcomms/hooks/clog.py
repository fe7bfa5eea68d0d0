"""``torchcomms.hooks.clog``: the pipe-delimited operation log (re-export)."""

from torchcomms_core.hooks.clog import clog

__all__ = ["clog"]

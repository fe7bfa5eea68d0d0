"""``torchcomms.hooks.nan_check``: refuse operations on NaN tensors (re-export)."""

from torchcomms_core.hooks.nan_check import NanCheckHook

__all__ = ["NanCheckHook"]

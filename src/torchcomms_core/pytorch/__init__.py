"""Bridges from torchcomms communicators into PyTorch: c10d groups, DeviceMesh, FR, objcol.

Nothing is imported here: ``torch.distributed`` imports parts of this package while it
is itself half-initialised, so each module is imported on its own, when needed.
"""

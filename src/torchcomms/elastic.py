"""``torchcomms.elastic``: process groups that follow ``TorchComm.reconfigure``."""

from __future__ import annotations

from torchcomms_core.pytorch.elastic import rebuild_process_group

__all__ = ["rebuild_process_group"]

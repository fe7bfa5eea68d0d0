"""List installed transports (``torchcomms.transports``): distribution, version, devices, and
whether they can run here; the one ``torchcomms._transport`` uses is marked.

The listing of every plugin kind (``torchcomms plugins``) for transports alone.
"""

from __future__ import annotations

from torchcomms_core.cli.plugins import listing_of

HELP, add_arguments, run = listing_of("transports")

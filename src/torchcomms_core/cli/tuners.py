"""List installed tuners (``torchcomms.tuners``): distribution, version, whether they run
here; the one communicators ask (``TORCHCOMM_TUNER``, else the built-in ``table``) is marked.

The listing of every plugin kind (``torchcomms plugins``) for tuners alone.
"""

from __future__ import annotations

from torchcomms_core.cli.plugins import listing_of

HELP, add_arguments, run = listing_of("tuners")

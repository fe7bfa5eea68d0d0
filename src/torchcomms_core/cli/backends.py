"""List installed backends: distribution, version, spec, devices, and whether they run here.

Each backend's plugin is imported to ask it; one that fails to import is listed as such.
The listing of every plugin kind (``torchcomms plugins``) for backends alone, with
``--algorithms``.
"""

from __future__ import annotations

from torchcomms_core.cli.plugins import listing_of

HELP, add_arguments, run = listing_of("backends")

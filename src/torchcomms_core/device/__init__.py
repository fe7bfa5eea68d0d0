"""Device-initiated communication through a CPU proxy: a window's command ring, the proxy
thread that drains it over the backend's own window paths, and the device side kernels use.

``layout`` fixes the shared memory, ``ring`` and ``proxy`` are the host's side of it,
``window`` builds a window's device side; ``functions`` (needs triton) holds the device
functions that ``torchcomms.triton`` re-exports (#56, docs/device.md).
"""

from __future__ import annotations

"""The version of every torchcomms distribution.

The core and the five plugins under plugins/ release together: each pyproject.toml reads
its version from this file (``[tool.hatch.version]``), and ``torchcomms_core.__version__``
imports it from here. Bump it in this one place.
"""

__version__ = "0.1.0"

"""Whether this PyTorch can compile torchcomms collectives, and whether that is switched on.

Cheap to import: reads two environment variables and compares version strings.
"""

from __future__ import annotations

import torch

from torchcomms_core.foundation import env as _env

#: The oldest PyTorch whose ``torch.library`` and opaque objects the compile path relies on.
MIN_PYTORCH_VERSION_FOR_COMPILE = "2.12.0.dev0"


def is_torch_compile_supported(
    min_version: str = MIN_PYTORCH_VERSION_FOR_COMPILE, _current_version: str | None = None
) -> bool:
    """Tell whether collectives can be traced by ``torch.compile`` with this PyTorch.

    Args:
        min_version: the oldest supported PyTorch version.
        _current_version: the version to judge instead of ``torch.__version__`` (tests).

    Returns:
        ``True`` if ``TORCHCOMMS_COMPILE_IGNORE_PYTORCH_VERSION_REQUIREMENT=1`` or the
        PyTorch version is at least ``min_version``.
    """
    if _env.compile_ignore_version_requirement():
        return True
    # torch vendors ``packaging``; using it adds no dependency.
    from torch._vendor.packaging.version import Version

    current = _current_version if _current_version is not None else str(torch.__version__)
    return Version(current) >= Version(min_version)


def is_torch_compile_supported_and_enabled(
    min_version: str = MIN_PYTORCH_VERSION_FOR_COMPILE, _current_version: str | None = None
) -> bool:
    """Tell whether the compile path is on: supported and ``TORCHCOMMS_PATCH_FOR_COMPILE=1``.

    When it is, ``import torchcomms`` registers the ``torchcomms`` custom ops and routes
    ``TorchComm`` collectives through them while tracing (see ``docs/torch-compile.md``).
    """
    return _env.patch_for_compile() and is_torch_compile_supported(min_version, _current_version)

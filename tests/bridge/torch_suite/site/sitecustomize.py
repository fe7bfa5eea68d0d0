"""Loaded by every Python process of a ``scripts/torch_dist_files.py`` run (the script puts
this folder first on ``PYTHONPATH``), so PyTorch's test processes, spawned ranks included,
get the hooks of ``torch_files_hooks``. It does nothing unless the script asked for it.
"""

import os

if os.environ.get("TORCHCOMMS_TORCH_FILES_HOOKS") == "1":
    import torch_files_hooks

    torch_files_hooks.install()

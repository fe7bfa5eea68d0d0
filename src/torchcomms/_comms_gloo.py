"""The reference's ``torchcomms._comms_gloo``:
``TorchCommGloo`` is the class of backend ``"gloo"``
(what ``new_comm("gloo", ...).get_backend_impl()`` is an instance of), loaded on first use."""

from torchcomms_core.plugin_host.backends import backend_module_getattr

__getattr__ = backend_module_getattr(__name__, {"TorchCommGloo": "gloo"})

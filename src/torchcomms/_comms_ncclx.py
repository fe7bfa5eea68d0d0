"""The reference's ``torchcomms._comms_ncclx``:
``TorchCommNCCLX`` is the class of backend ``"ncclx"``
(what ``new_comm("ncclx", ...).get_backend_impl()`` is an instance of), loaded on first use."""

from torchcomms_core.plugin_host.backends import backend_module_getattr

__getattr__ = backend_module_getattr(__name__, {"TorchCommNCCLX": "ncclx"})

"""The reference's ``torchcomms._comms_rccl``:
``TorchCommRCCL`` is the class of backend ``"rccl"``
(what ``new_comm("rccl", ...).get_backend_impl()`` is an instance of), loaded on first use."""

from torchcomms_core.plugin_host.backends import backend_module_getattr

__getattr__ = backend_module_getattr(__name__, {"TorchCommRCCL": "rccl"})

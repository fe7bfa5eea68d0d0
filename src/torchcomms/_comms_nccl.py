"""The reference's ``torchcomms._comms_nccl``:
``TorchCommNCCL`` is the class of backend ``"nccl"``
(what ``new_comm("nccl", ...).get_backend_impl()`` is an instance of), loaded on first use."""

from torchcomms_core.plugin_host.backends import backend_module_getattr

__getattr__ = backend_module_getattr(__name__, {"TorchCommNCCL": "nccl"})

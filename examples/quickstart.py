"""The announcement's example on the gloo backend: run it with
``torchrun --standalone --nproc-per-node 4 examples/quickstart.py``.

One change besides backend and device: the announcement wrote ``torch.full(...,
value=...)``, which PyTorch rejects; its keyword is ``fill_value``.
"""

import torch

import torchcomms

comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="my_comm")
print(f"I am rank {comm.get_rank()} of {comm.get_size()}!")
t = torch.full((10, 20), fill_value=comm.get_rank(), dtype=torch.float)
comm.all_reduce(t, torchcomms.ReduceOp.SUM, async_op=False)
work = comm.all_reduce(t, torchcomms.ReduceOp.SUM, async_op=True)
work.wait()
n = comm.get_size()
print(
    f"rank {comm.get_rank()}: after two all_reduce(SUM) every element is {t[0, 0].item():g} "
    f"(expected {n * n * (n - 1) / 2:g})"
)

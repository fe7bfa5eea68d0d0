"""The model, data and single-process reference shared by the training examples.

Every example trains this MLP on the same seeded batches, so each can compare its
distributed losses with ``reference()`` computed in one process.
"""

from __future__ import annotations

import torch
from torch import nn

GLOBAL_BATCH = 16
LR = 0.05


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)
    )


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [
        (torch.randn(GLOBAL_BATCH, 32, generator=gen), torch.randn(GLOBAL_BATCH, 8, generator=gen))
        for _ in range(steps)
    ]


def reference(steps: int) -> list[float]:
    """The same training in this one process, on the whole global batch."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in batches(steps):
        loss = nn.functional.mse_loss(model(x), y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
    return losses

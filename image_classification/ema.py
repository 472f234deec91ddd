"""Exponential moving average of a model's weights and BatchNorm statistics."""

from __future__ import annotations

import copy

import torch
from torch import nn


def ema_decay(decay: float, step: int) -> float:
    """The reference's warm-up: small steps average fast, later ones at ``decay``."""
    return min(decay, (1 + step) / (10 + step))


class ModelEma:
    """A frozen copy of the model, updated after every optimizer step (never on accumulation steps)."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.module = copy.deepcopy(model).eval()
        for param in self.module.parameters():
            param.requires_grad_(False)

    def _pairs(self, model: nn.Module):
        ours = self.module.state_dict()
        theirs = model.state_dict()
        keys = [k for k, v in ours.items() if v.dtype.is_floating_point]
        return [ours[k] for k in keys], [theirs[k] for k in keys]

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        mu = ema_decay(self.decay, step)
        averages, currents = self._pairs(model)
        torch._foreach_mul_(averages, mu)
        torch._foreach_add_(averages, currents, alpha=1.0 - mu)

    def state_dict(self) -> dict:
        return self.module.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state)

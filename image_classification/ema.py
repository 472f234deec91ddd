"""Exponential moving average of a model's weights and BatchNorm statistics."""

from __future__ import annotations

import copy

import torch
from torch import nn


def ema_decay(decay: float, step: int) -> float:
    """The reference's warm-up: small steps average fast, later ones at ``decay``."""
    return min(decay, (1 + step) / (10 + step))


def _state_tensors(model: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(floating parameters and buffers, the other buffers), in ``state_dict`` order."""
    floating, other = [], []
    for tensor in model.state_dict(keep_vars=True).values():
        (floating if tensor.is_floating_point() else other).append(tensor.detach())
    return floating, other


class ModelEma:
    """A frozen copy of the model, updated after every optimizer step (never on accumulation steps).

    The tensor lists of both models are gathered once, so an update is two multi-tensor operations: a
    ``lerp`` of the floating tensors (weights and BatchNorm statistics) towards the model's, and a copy
    of the integer buffers (BatchNorm's ``num_batches_tracked``). The lists hold the model's tensors
    themselves: move the model to its device before building the average, not after.
    """

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.module = copy.deepcopy(model).eval()
        for param in self.module.parameters():
            param.requires_grad_(False)
        self._averages, self._counters = _state_tensors(self.module)
        self._bind(model)

    def _bind(self, model: nn.Module) -> None:
        self._source = model
        self._currents, self._current_counters = _state_tensors(model)
        if len(self._currents) != len(self._averages) or len(self._current_counters) != len(self._counters):
            raise ValueError("the model's state does not have the layout of the averaged copy")

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        """Move the average towards ``model``'s state by ``1 - ema_decay(decay, step)``."""
        if model is not self._source:
            self._bind(model)
        weight = 1.0 - ema_decay(self.decay, step)
        torch._foreach_lerp_(self._averages, self._currents, weight)
        if self._counters:
            torch._foreach_copy_(self._counters, self._current_counters)

    def state_dict(self) -> dict:
        return self.module.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Copy ``state`` into the averaged copy (in place: the cached tensor lists stay valid)."""
        self.module.load_state_dict(state)

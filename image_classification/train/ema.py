"""Exponential moving average of a model's weights and BatchNorm statistics.

One implementation serves both flags.  ``--use-ema DECAY`` is the reference's: an update after every
optimizer step with the warm-up :func:`ema_decay`.  ``--model-ema`` is torchvision's: an update every
``--model-ema-steps`` optimizer steps, the decay adjusted to that interval and the batch
(:func:`torchvision_decay`), the first update copying the weights, and every update of an LR warm-up epoch
restarting the average from the weights.  ``--model-ema-warmup`` replaces either warm-up by timm's
(:func:`timm_ema_decay`).  Floating parameters and buffers (BatchNorm statistics) are averaged, integer
buffers copied.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from .optim import in_layout_of

WARMUPS = ("reference", "timm", "none")
TIMM_WARMUP_POWER = 2 / 3  # timm ModelEmaV3's default, with inv_gamma 1


def ema_decay(decay: float, step: int) -> float:
    """The reference's warm-up: small steps average fast, later ones at ``decay`` (``step``: optimizer steps
    taken, 1 at the first update)."""
    return min(decay, (1 + step) / (10 + step))


def timm_ema_decay(decay: float, updates: int) -> float:
    """timm ModelEmaV3's warm-up (gamma 1, power 2/3) for the update that follows ``updates`` earlier ones:
    ``min(decay, 1 - (1 + updates)^(-2/3))``, 0 at the first (a copy)."""
    return min(decay, 1.0 - (1.0 + updates) ** -TIMM_WARMUP_POWER)


def torchvision_decay(decay: float, *, images_per_step: int, steps: int, epochs: int) -> float:
    """torchvision train.py's decay per update: ``alpha = min(1, (1 - decay) * images_per_step * steps /
    epochs)``, ``1 - alpha`` (its ``images_per_step`` is world size x batch; ours includes accumulation)."""
    alpha = min(1.0, (1.0 - decay) * images_per_step * steps / epochs)
    return 1.0 - alpha


def _state_tensors(model: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(floating parameters and buffers, the other buffers), in ``state_dict`` order."""
    floating, other = [], []
    for tensor in model.state_dict(keep_vars=True).values():
        (floating if tensor.is_floating_point() else other).append(tensor.detach())
    return floating, other


class ModelEma:
    """A frozen copy of the model, updated after every ``every``-th optimizer step (never on accumulation
    steps).

    The tensor lists of both models are gathered once, so an update is two multi-tensor operations: a
    ``lerp`` of the floating tensors (weights and BatchNorm statistics) towards the model's, and a copy
    of the integer buffers (BatchNorm's ``num_batches_tracked``). The lists hold the model's tensors
    themselves: move the model to its device before building the average, not after.

    ``updates`` counts the updates since the average last started from the weights (torchvision's
    ``n_averaged``); a checkpoint records it beside the averaged weights.
    """

    def __init__(self, model: nn.Module, decay: float, *, every: int = 1, warmup: str = "reference",
                 restart_epochs: int = 0):
        """``warmup``: one of :data:`WARMUPS` ("none" and "timm" copy the weights at the first update);
        ``restart_epochs``: the updates of epochs before it restart the average (torchvision's LR warm-up)."""
        if warmup not in WARMUPS:
            raise ValueError(f"unknown EMA warm-up {warmup!r}")
        self.decay, self.every, self.warmup, self.restart_epochs = decay, every, warmup, restart_epochs
        self.updates = 0
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
        pairs = zip(self._averages, self._currents)
        if any(average.stride() != current.stride() for average, current in pairs):
            self._take_memory_layout(model)

    def _take_memory_layout(self, model: nn.Module) -> None:
        """Lay the averaged copy's tensors out as ``model``'s (values kept by index), so that an update pairs
        tensors of one layout (CUDA's multi-tensor kernels take their fast path only then) and a checkpoint
        loads into the model's layout, whatever layout wrote it."""
        layouts = model.state_dict(keep_vars=True)
        state = {name: in_layout_of(tensor, layouts[name]) if name in layouts else tensor
                 for name, tensor in self.module.state_dict().items()}
        self.module.load_state_dict(state, assign=True)  # assign: the new strides, requires_grad kept
        self._averages, self._counters = _state_tensors(self.module)

    def decay_at(self, step: int) -> float:
        """The decay of the update after optimizer step ``step`` (1-based)."""
        if self.warmup == "reference":
            return ema_decay(self.decay, step)
        if self.warmup == "timm":
            return timm_ema_decay(self.decay, self.updates)
        return self.decay if self.updates else 0.0

    @torch.no_grad()
    def update(self, model: nn.Module, step: int, epoch: int = 0) -> None:
        """After optimizer step ``step`` (1-based) of 0-based ``epoch``: on every ``every``-th step, move the
        average towards ``model``'s state by ``1 - decay_at(step)``."""
        if step % self.every:
            return
        if model is not self._source:
            self._bind(model)
        weight = 1.0 - self.decay_at(step)
        if weight == 1.0:
            torch._foreach_copy_(self._averages, self._currents)
        else:
            torch._foreach_lerp_(self._averages, self._currents, weight)
        if self._counters:
            torch._foreach_copy_(self._counters, self._current_counters)
        self.updates = 0 if epoch < self.restart_epochs else self.updates + 1

    def state_dict(self) -> dict:
        return self.module.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Copy ``state`` into the averaged copy (in place: the cached tensor lists stay valid, and the copy
        keeps the model's memory layout whatever layout ``state`` was written in)."""
        self.module.load_state_dict(state)

"""Optimizers, weight-decay grouping and learning-rate schedules (pure functions of the epoch)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .errors import UserError

STEP_MILESTONES = (30, 60, 80)


def lr_at(epoch: int, *, base_lr: float, schedule: str, warmup: int, epochs: int, end_lr: float = 0.0) -> float:
    """The learning rate of 0-based ``epoch`` (constant within an epoch, as in the reference)."""
    if epoch < warmup:
        return base_lr * (epoch + 1) / warmup
    if schedule == "step":
        return base_lr * 0.1 ** sum(epoch >= milestone for milestone in STEP_MILESTONES)
    progress = (epoch - warmup) / max(epochs - warmup, 1)
    if schedule == "linear":
        return base_lr * (1.0 - progress)
    if schedule == "cosine":
        return end_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (base_lr - end_lr)
    raise UserError(f"unknown LR schedule {schedule!r}; choose step, linear or cosine")


def split_weight_decay(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(BatchNorm parameters, all others): every BN counts, the downsample BNs included."""
    bn_ids = {
        id(param)
        for module in model.modules()
        if isinstance(module, nn.modules.batchnorm._BatchNorm)
        for param in module.parameters(recurse=False)
    }
    bn, rest = [], []
    for param in model.parameters():
        if param.requires_grad:
            (bn if id(param) in bn_ids else rest).append(param)
    return bn, rest


def build_optimizer(model: nn.Module, *, name: str, lr: float, momentum: float, weight_decay: float,
                    nesterov: bool = False, bn_weight_decay: bool = False, rmsprop_alpha: float = 0.9,
                    rmsprop_eps: float = 1e-3, log=print) -> torch.optim.Optimizer:
    """SGD or RMSprop over two groups: BatchNorm parameters (no decay unless asked) and the rest."""
    bn, rest = split_weight_decay(model)
    groups = [
        {"params": bn, "weight_decay": weight_decay if bn_weight_decay else 0.0},
        {"params": rest, "weight_decay": weight_decay},
    ]
    if bn_weight_decay:
        log(" ! Weight decay applied to BN parameters ")
    else:
        log(f" ! Weight decay NOT applied to BN parameters  {len(bn)} {len(rest)}")
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=nesterov)
    if name == "rmsprop":
        return torch.optim.RMSprop(groups, lr=lr, alpha=rmsprop_alpha, eps=rmsprop_eps, momentum=momentum)
    raise UserError(f"unknown optimizer {name!r}; choose sgd or rmsprop")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr

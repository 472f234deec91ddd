"""Optimizers, weight-decay grouping and learning-rate schedules (pure functions of the epoch)."""

from __future__ import annotations

import inspect
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


def make_optimizer(optimizer_class: type[torch.optim.Optimizer], groups: list[dict], **options) -> torch.optim.Optimizer:
    """``optimizer_class`` with its fused kernel where this torch has one for the parameters' device and
    dtype (SGD on CUDA and, from torch 2.4, on the CPU), else with its foreach (multi-tensor) kernels.

    The fused update is one kernel per parameter group: on CUDA it lets ``GradScaler.step`` hand its
    inf check to the kernel instead of reading it back to the host, and on the CPU it is faster than the
    for-loop update. The optimizer's constructor decides what it supports.
    """
    if "fused" in inspect.signature(optimizer_class).parameters:
        try:
            return optimizer_class(groups, fused=True, **options)
        except RuntimeError:  # no fused kernel for this device or dtype
            pass
    return optimizer_class(groups, foreach=True, **options)


def build_optimizer(model: nn.Module, *, name: str, lr: float, momentum: float, weight_decay: float,
                    nesterov: bool = False, bn_weight_decay: bool = False, rmsprop_alpha: float = 0.9,
                    rmsprop_eps: float = 1e-3, log=print) -> torch.optim.Optimizer:
    """SGD or RMSprop over two groups: BatchNorm parameters (no decay unless asked) and the rest.

    Build it after the model is on its device: :func:`make_optimizer` picks the kernels for it.
    """
    bn, rest = split_weight_decay(model)
    groups = [
        {"params": bn, "weight_decay": weight_decay if bn_weight_decay else 0.0},
        {"params": rest, "weight_decay": weight_decay},
    ]
    if bn_weight_decay:
        log(f"=> weight decay {weight_decay:g} on all {len(bn) + len(rest)} parameter tensors, BatchNorm included")
    else:
        log(f"=> weight decay {weight_decay:g} on {len(rest)} parameter tensors; none on the {len(bn)} BatchNorm "
            "ones (--bn-weight-decay includes them)")
    if name == "sgd":
        return make_optimizer(torch.optim.SGD, groups, lr=lr, momentum=momentum, nesterov=nesterov)
    if name == "rmsprop":
        return make_optimizer(torch.optim.RMSprop, groups, lr=lr, alpha=rmsprop_alpha, eps=rmsprop_eps,
                              momentum=momentum)
    raise UserError(f"unknown optimizer {name!r}; choose sgd or rmsprop")


IMPLEMENTATION_FLAGS = ("fused", "foreach")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load ``state`` but keep the kernels :func:`make_optimizer` chose here (a checkpoint's parameter
    groups carry the flags of the machine and torch version that wrote it)."""
    chosen = [{flag: group.get(flag) for flag in IMPLEMENTATION_FLAGS} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, flags in zip(optimizer.param_groups, chosen):
        group.update(flags)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Give every parameter group the learning rate ``lr``."""
    for group in optimizer.param_groups:
        group["lr"] = lr

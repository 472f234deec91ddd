"""EfficientNet B0-B7 and the widese variants, as NVIDIA's ConvNets toolkit defines them.

Every variant is one row of ``archs.EFFICIENTNETS``: B0's stages (``archs.EFFICIENTNET_B0_STAGES``) with their
channels and repeats scaled by the row's width and depth coefficients (``archs.efficientnet_layout``), fed to
``EfficientNet``; the MBConv block and the squeeze-and-excitation (``resnet.SqueezeExcitation`` with SiLU) are
the only other classes.  State-dict keys are the reference's (``stem``, ``layers.{stage}.block{j}``,
``features``, ``classifier.fc``), so its weights load as they are.  Convolutions start Kaiming-normal (ReLU
gain, ``conv_init``'s fan: fan_in by default), BN at 1 and 0 with momentum 0.01 and epsilon 1e-3, the linear
layers at PyTorch's default, as in the reference.

Stochastic depth (``survival_prob`` below 1; the reference's b4 rows: 0.8) drops a residual block's branch
with probability ``(1 - survival_prob) * i / n`` for the ``i``-th of ``n`` blocks (from 0), and scales a kept
one by the inverse of its survival, in training only. It is drawn per sample, as the original TensorFlow
EfficientNet, torchvision and timm draw it, not once per batch as the reference does (a Python draw at its
release, April 2021; a scalar mask from November 2021, whose draw was discarded until December 2022, so that
no block was dropped): per batch, every image of a device's batch loses the same blocks and a step's gradient
is with or without them; per sample the batch averages over both. The expectation is the same and evaluation
is identical, so weights move between the two unchanged.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from .archs import EFFICIENTNET_SE_RATIO, EFFICIENTNETS, efficientnet_layout
from .resnet import SqueezeExcitation, init_weights

Norm = Callable[[int], nn.Module]


def conv_bn(in_channels: int, out_channels: int, kernel: int, norm: Norm, stride: int = 1, groups: int = 1,
            activation: bool = True) -> nn.Sequential:
    """``conv`` (padded to keep the size at stride 1, no bias), ``bn`` and, with ``activation``, SiLU."""
    layers = [("conv", nn.Conv2d(in_channels, out_channels, kernel, stride, (kernel - 1) // 2, groups=groups,
                                 bias=False)),
              ("bn", norm(out_channels))]
    if activation:
        layers.append(("act", nn.SiLU(inplace=True)))
    return nn.Sequential(OrderedDict(layers))


class MBConv(nn.Module):
    """Inverted residual: 1x1 ``expand`` (none at expansion 1), depthwise ``depsep`` (the stride), ``se``, 1x1
    ``proj`` without activation; the input is added back where stride and widths allow (stochastic depth)."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int, expansion: int,
                 se_channels: int, survival: float, norm: Norm):
        super().__init__()
        hidden = in_channels * expansion
        self.expand = None if expansion == 1 else conv_bn(in_channels, hidden, 1, norm)
        self.depsep = conv_bn(hidden, hidden, kernel, norm, stride, groups=hidden)
        self.se = SqueezeExcitation(hidden, se_channels, nn.SiLU())
        self.proj = conv_bn(hidden, out_channels, 1, norm, activation=False)
        self.residual = stride == 1 and in_channels == out_channels
        self.survival = float(survival)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x if self.expand is None else self.expand(x)
        out = self.proj(self.se(self.depsep(out)))
        if not self.residual:
            return out
        if self.training and self.survival < 1.0:
            keep = torch.empty((out.shape[0], 1, 1, 1), dtype=out.dtype, device=out.device)
            out = out * keep.bernoulli_(self.survival).div_(self.survival)
        return x + out


class EfficientNet(nn.Module):
    """``stem`` (3x3/2 conv, BN, SiLU), ``layers`` (a stage of MBConv blocks per row of ``stages``),
    ``features`` (1x1 conv to ``head`` channels, BN, SiLU), ``classifier`` (average pool, flatten, dropout,
    linear)."""

    def __init__(self, stem: int, stages: Sequence[tuple[int, int, int, int, int]], head: int, widese: bool,
                 num_classes: int = 1000, dropout: float = 0.2, survival_prob: float = 1.0,
                 norm: Optional[Norm] = None):
        super().__init__()
        norm = norm or nn.BatchNorm2d
        self.stem = conv_bn(3, stem, 3, norm, stride=2)
        total, index, channels_in = sum(stage[2] for stage in stages), 0, stem
        layers = []
        for kernel, stride, repeats, expansion, channels in stages:
            blocks = OrderedDict()
            for j in range(repeats):
                se_base = channels_in * expansion if widese else channels_in
                survival = 1.0 - (1.0 - survival_prob) * index / total
                se_channels = max(1, int(se_base * EFFICIENTNET_SE_RATIO))
                blocks[f"block{j}"] = MBConv(channels_in, channels, kernel, stride if j == 0 else 1,
                                             expansion, se_channels, survival, norm)
                channels_in, index = channels, index + 1
            layers.append(nn.Sequential(blocks))
        self.layers = nn.Sequential(*layers)
        self.features = conv_bn(channels_in, head, 1, norm)
        self.classifier = nn.Sequential(OrderedDict([
            ("pooling", nn.AdaptiveAvgPool2d(1)), ("squeeze", nn.Flatten()), ("dropout", nn.Dropout(dropout)),
            ("fc", nn.Linear(head, num_classes))]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(self.layers(self.stem(x))))


def efficientnet(arch: str, num_classes: int = 1000, conv_init: str = "fan_in", bn_momentum: float = 0.01,
                 bn_epsilon: float = 1e-3, dropout: Optional[float] = None,
                 survival_prob: Optional[float] = None) -> EfficientNet:
    """Build the ``EFFICIENTNETS`` row ``arch`` (the name and values are assumed valid; see
    ``models.build_model``); ``dropout`` and ``survival_prob`` default to the row's."""
    row_dropout, row_survival, widese = EFFICIENTNETS[arch][3:]
    stem, stages, head = efficientnet_layout(arch)
    model = EfficientNet(stem, stages, head, widese, num_classes, row_dropout if dropout is None else dropout,
                         row_survival if survival_prob is None else survival_prob,
                         partial(nn.BatchNorm2d, momentum=bn_momentum, eps=bn_epsilon))
    init_weights(model, conv_init)
    return model

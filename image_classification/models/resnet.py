"""ResNet, ResNeXt and SE-ResNeXt (v1.5: a bottleneck's stride sits on its 3x3 conv).

Every variant is one row of ``archs.ARCHS`` fed to ``ResNet``; the blocks are the only other classes.
State-dict keys follow torchvision (``conv1``, ``bn1``, ``layer1``..``layer4``, ``fc``), so torchvision
weights load as they are.
"""

from typing import Optional

import torch
from torch import nn

from .archs import ARCHS

SE_HIDDEN = 16  # fixed, not C/16: the published SE-ResNeXt weights use 16


class SqueezeExcitation(nn.Module):
    """Scale each channel by sigmoid(expand(activation(squeeze(mean over H, W)))); ReLU unless told."""

    def __init__(self, channels: int, hidden: int = SE_HIDDEN, activation: Optional[nn.Module] = None):
        super().__init__()
        self.squeeze = nn.Linear(channels, hidden)
        self.activation = nn.ReLU() if activation is None else activation
        self.expand = nn.Linear(hidden, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.expand(self.activation(self.squeeze(x.mean(dim=(2, 3)))))
        return x * torch.sigmoid(scale)[:, :, None, None]


class BasicBlock(nn.Module):
    """Two 3x3 convs; the first carries the stride."""

    def __init__(self, inplanes: int, width: int, stride: int = 1, downsample: Optional[nn.Module] = None,
                 expansion: int = 1, groups: int = 1, se: bool = False):
        super().__init__()
        out = width * expansion
        self.conv1 = nn.Conv2d(inplanes, width, 3, stride, 1, groups=groups, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(width, out, 3, 1, 1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.squeeze = SqueezeExcitation(out) if se else None
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.squeeze is not None:
            out = self.squeeze(out)
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (grouped, strided), 1x1 expand."""

    def __init__(self, inplanes: int, width: int, stride: int = 1, downsample: Optional[nn.Module] = None,
                 expansion: int = 4, groups: int = 1, se: bool = False):
        super().__init__()
        out = width * expansion
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.squeeze = SqueezeExcitation(out) if se else None
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.squeeze is not None:
            out = self.squeeze(out)
        return self.relu(out + identity)


BLOCK_CLASSES: dict[str, type[nn.Module]] = {"basic": BasicBlock, "bottleneck": Bottleneck}


class ResNet(nn.Module):
    """Stem (7x7/2 conv, BN, ReLU, 3x3/2 max-pool), four stages, global average pool, linear head."""

    def __init__(self, block: type[nn.Module], layers: tuple[int, ...], widths: tuple[int, ...],
                 expansion: int, groups: int = 1, se: bool = False, num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes = 64
        for i, (depth, width) in enumerate(zip(layers, widths)):
            stride = 1 if i == 0 else 2
            out = width * expansion
            downsample = None
            if stride != 1 or inplanes != out:
                downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False),
                                           nn.BatchNorm2d(out))
            blocks = [block(inplanes, width, stride, downsample, expansion, groups, se)]
            blocks += [block(out, width, 1, None, expansion, groups, se) for _ in range(depth - 1)]
            self.add_module(f"layer{i + 1}", nn.Sequential(*blocks))
            inplanes = out
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def init_weights(model: nn.Module, conv_init: str = "fan_out", last_bn_0_init: bool = False) -> None:
    """Kaiming-normal convs (ReLU gain, ``conv_init`` fan mode), BN gamma 1 / beta 0, default Linear.

    ``last_bn_0_init`` zeroes the gamma of each block's last BN so every residual branch starts as zero.
    """
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode=conv_init, nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    if last_bn_0_init:
        for m in model.modules():
            if isinstance(m, Bottleneck):
                nn.init.zeros_(m.bn3.weight)
            elif isinstance(m, BasicBlock):
                nn.init.zeros_(m.bn2.weight)


def resnet(arch: str, num_classes: int = 1000, conv_init: str = "fan_out",
           last_bn_0_init: bool = False) -> ResNet:
    """Build the ``ARCHS`` row ``arch`` (the name is assumed valid; see ``models.build_model``)."""
    block, layers, widths, expansion, groups, se = ARCHS[arch]
    model = ResNet(BLOCK_CLASSES[block], layers, widths, expansion, groups, se, num_classes)
    init_weights(model, conv_init, last_bn_0_init)
    return model

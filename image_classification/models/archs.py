"""The architecture tables: every variant as one row of data, the ResNet family's (:data:`ARCHS`) read by
``resnet.resnet`` and the EfficientNet family's (:data:`EFFICIENTNETS`) by ``efficientnet.efficientnet``.

Standard library only, so that the command lines can list the architectures (``--arch``'s choices and
help) without importing torch.

ResNet columns: block (``basic``: two 3x3 convs; ``bottleneck``: 1x1, 3x3, 1x1), layers per stage, inner width
per stage, expansion (block output = width * expansion), groups of the 3x3 convs, and whether every block
ends in squeeze-and-excitation.

``resnext101-32x8d-basic`` is a ResNeXt made of basic blocks, read from its name: 32 groups of 8
channels in the first stage, doubling per stage (widths 256, 512, 1024, 2048, expansion 1), on both 3x3
convs of every block; layers [3, 4, 23, 3]. Its head sees 2048 features like the bottleneck models;
25,521,448 parameters at 1000 classes. No published weights exist for it.
"""

from __future__ import annotations

import math

BLOCKS = ("basic", "bottleneck")

#   name                      block         layers          widths                  exp groups  se
ARCHS: dict[str, tuple[str, tuple[int, ...], tuple[int, ...], int, int, bool]] = {
    "resnet18":               ("basic",      (2, 2, 2, 2),  (64, 128, 256, 512),    1, 1,  False),
    "resnet34":               ("basic",      (3, 4, 6, 3),  (64, 128, 256, 512),    1, 1,  False),
    "resnet50":               ("bottleneck", (3, 4, 6, 3),  (64, 128, 256, 512),    4, 1,  False),
    "resnet101":              ("bottleneck", (3, 4, 23, 3), (64, 128, 256, 512),    4, 1,  False),
    "resnet152":              ("bottleneck", (3, 8, 36, 3), (64, 128, 256, 512),    4, 1,  False),
    "resnext50-32x4d":        ("bottleneck", (3, 4, 6, 3),  (128, 256, 512, 1024),  2, 32, False),
    "resnext101-32x4d":       ("bottleneck", (3, 4, 23, 3), (128, 256, 512, 1024),  2, 32, False),
    "resnext101-32x8d":       ("bottleneck", (3, 4, 23, 3), (256, 512, 1024, 2048), 1, 32, False),
    "resnext101-32x8d-basic": ("basic",      (3, 4, 23, 3), (256, 512, 1024, 2048), 1, 32, False),
    "se-resnext101-32x4d":    ("bottleneck", (3, 4, 23, 3), (128, 256, 512, 1024),  2, 32, True),
}


# EfficientNet-B0's stages, which every EfficientNet scales (the reference's table; squeeze-and-excitation on
# a quarter of each block's input channels, of its hidden ones in the widese variants).
#                          kernel  stride  repeats  expansion  channels
EFFICIENTNET_B0_STAGES = ((3,      1,      1,       1,         16),
                          (3,      2,      2,       6,         24),
                          (5,      2,      2,       6,         40),
                          (3,      2,      3,       6,         80),
                          (5,      1,      3,       6,         112),
                          (5,      2,      4,       6,         192),
                          (3,      1,      1,       6,         320))
EFFICIENTNET_B0_STEM, EFFICIENTNET_B0_HEAD, EFFICIENTNET_SE_RATIO = 32, 1280, 0.25

# Columns: width and depth coefficients (channels and repeats of every stage scaled by them), the image size,
# the classifier's dropout, stochastic depth's survival probability of the last block, whether the
# squeeze-and-excitation works on the hidden channels (widese).  The reference's values: survival 0.8 for b4
# only.
#   name                      width  depth  size  dropout  survival  widese
EFFICIENTNETS: dict[str, tuple[float, float, int, float, float, bool]] = {
    "efficientnet-b0":        (1.0,  1.0,   224,  0.2,     1.0,      False),
    "efficientnet-b1":        (1.0,  1.1,   240,  0.2,     1.0,      False),
    "efficientnet-b2":        (1.1,  1.2,   260,  0.3,     1.0,      False),
    "efficientnet-b3":        (1.2,  1.4,   300,  0.3,     1.0,      False),
    "efficientnet-b4":        (1.4,  1.8,   380,  0.4,     0.8,      False),
    "efficientnet-b5":        (1.6,  2.2,   456,  0.4,     1.0,      False),
    "efficientnet-b6":        (1.8,  2.6,   528,  0.5,     1.0,      False),
    "efficientnet-b7":        (2.0,  3.1,   600,  0.5,     1.0,      False),
    "efficientnet-widese-b0": (1.0,  1.0,   224,  0.2,     1.0,      True),
    "efficientnet-widese-b1": (1.0,  1.1,   240,  0.2,     1.0,      True),
    "efficientnet-widese-b2": (1.1,  1.2,   260,  0.3,     1.0,      True),
    "efficientnet-widese-b3": (1.2,  1.4,   300,  0.3,     1.0,      True),
    "efficientnet-widese-b4": (1.4,  1.8,   380,  0.4,     0.8,      True),
    "efficientnet-widese-b5": (1.6,  2.2,   456,  0.4,     1.0,      True),
    "efficientnet-widese-b6": (1.8,  2.6,   528,  0.5,     1.0,      True),
    "efficientnet-widese-b7": (2.0,  3.1,   600,  0.5,     1.0,      True),
}

# The options of build_model each family takes (beside num_classes), in the order the docs name them.
FAMILY_OPTIONS: dict[str, tuple[str, ...]] = {
    "resnet": ("model_config", "last_bn_0_init", "conv_init"),
    "efficientnet": ("conv_init", "bn_momentum", "bn_epsilon", "dropout", "survival_prob"),
}


def scaled_width(channels: int, width: float, divisor: int = 8) -> int:
    """``channels * width`` rounded to a multiple of ``divisor``, at least ``divisor`` and never 10% below."""
    scaled = channels * width
    rounded = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * scaled else rounded


def scaled_depth(repeats: int, depth: float) -> int:
    """``repeats * depth``, rounded up."""
    return int(math.ceil(repeats * depth))


def efficientnet_layout(arch: str) -> tuple[int, list[tuple[int, int, int, int, int]], int]:
    """(stem channels, stages as (kernel, stride, repeats, expansion, channels), head channels) of the
    ``EFFICIENTNETS`` row ``arch``: B0's scaled by its width and depth."""
    width, depth = EFFICIENTNETS[arch][:2]
    stages = [(kernel, stride, scaled_depth(repeats, depth), expansion, scaled_width(channels, width))
              for kernel, stride, repeats, expansion, channels in EFFICIENTNET_B0_STAGES]
    return scaled_width(EFFICIENTNET_B0_STEM, width), stages, scaled_width(EFFICIENTNET_B0_HEAD, width)


def family(arch: str) -> str | None:
    """``resnet`` or ``efficientnet``: the table that holds ``arch``; None for a name of neither."""
    if arch in ARCHS:
        return "resnet"
    return "efficientnet" if arch in EFFICIENTNETS else None


def all_archs() -> list[str]:
    """Every architecture's name, the ResNet family's first: ``--arch``'s choices."""
    return [*ARCHS, *EFFICIENTNETS]


QUANT_INFIX = "-quant-"  # the reference's spelling of a quantization-aware EfficientNet: efficientnet-quant-b0


def quant_spellings() -> list[str]:
    """The reference's names of the quantization-aware EfficientNets (``efficientnet-quant-b0``...), accepted by
    ``--arch`` as the plain architecture trained quantized."""
    return [name.replace("-", QUANT_INFIX, 1) for name in EFFICIENTNETS]


def plain_arch(arch: str) -> tuple[str, bool]:
    """(the architecture, whether its name asked for quantization-aware training): ``efficientnet-quant-b0`` is
    ``(efficientnet-b0, True)``, any other name itself with False."""
    if arch in quant_spellings():
        return arch.replace(QUANT_INFIX, "-", 1), True
    return arch, False


def designed_image_size(arch: str) -> int:
    """The training and validation crop ``arch`` was designed for (the name is assumed valid)."""
    return EFFICIENTNETS[arch][2] if arch in EFFICIENTNETS else 224


def cpu_trains_faster_channels_last(arch: str) -> bool:
    """Whether ``arch`` trains faster in the channels-last layout on an AVX512 CPU (``--memory-format auto``'s choice
    there; :func:`..system.host.choose` keeps NCHW on an AVX2 one): the bottleneck ResNets and the EfficientNets,
    not the basic-block ResNet-18 and -34 (docs/performance.md, "The memory format on the CPU")."""
    return arch in EFFICIENTNETS or ARCHS[arch][0] == "bottleneck"


# conv_init mode of each legacy --model-config preset; all of them use ReLU and no zero-init of BN.
MODEL_CONFIGS: dict[str, dict[str, str]] = {
    "classic": {"conv_init": "fan_out"},
    "fanin": {"conv_init": "fan_in"},
    "grp-fanin": {"conv_init": "fan_in"},
    "grp-fanout": {"conv_init": "fan_out"},
}

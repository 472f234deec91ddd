"""The architecture table: every variant as one row of data, read by ``resnet.resnet`` to build it.

Standard library only, so that the command lines can list the architectures (``--arch``'s choices and
help) without importing torch.

Columns: block (``basic``: two 3x3 convs; ``bottleneck``: 1x1, 3x3, 1x1), layers per stage, inner width
per stage, expansion (block output = width * expansion), groups of the 3x3 convs, and whether every block
ends in squeeze-and-excitation.

``resnext101-32x8d-basic`` is a ResNeXt made of basic blocks, read from its name: 32 groups of 8
channels in the first stage, doubling per stage (widths 256, 512, 1024, 2048, expansion 1), on both 3x3
convs of every block; layers [3, 4, 23, 3]. Its head sees 2048 features like the bottleneck models;
25,521,448 parameters at 1000 classes. No published weights exist for it.
"""

from __future__ import annotations

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



def cpu_trains_faster_channels_last(arch: str) -> bool:
    """Whether ``arch`` trains faster on the CPU in the channels-last layout (``--memory-format auto``'s choice
    there): the bottleneck models, whose training step ran 1.13x (32 px, within noise) to 1.43x (224 px) faster in
    it; not the basic-block ResNet-18 and -34 (ResNet-18: 0.87x at 32 px, 0.99x at 96 px) (docs/performance.md,
    "The memory format on the CPU")."""
    return ARCHS[arch][0] == "bottleneck"


# conv_init mode of each legacy --model-config preset; all of them use ReLU and no zero-init of BN.
MODEL_CONFIGS: dict[str, dict[str, str]] = {
    "classic": {"conv_init": "fan_out"},
    "fanin": {"conv_init": "fan_in"},
    "grp-fanin": {"conv_init": "fan_in"},
    "grp-fanout": {"conv_init": "fan_out"},
}

"""torch.hub entry points with the names NVIDIA published (the ResNets' and the EfficientNets'), e.g.
``torch.hub.load("path/to/this/repo", "nvidia_resnet50", source="local", pretrained=False)``."""

dependencies = ["torch"]

from image_classification.models import build_model, load_weights  # noqa: E402
from image_classification.models.weights import fetch_pretrained  # noqa: E402


def _entry(arch, pretrained, **kwargs):
    model = build_model(arch, **kwargs)
    if pretrained:
        # A different num_classes keeps a fresh head, which is what fine-tuning from the hub wants.
        load_weights(model, fetch_pretrained(arch), allow_head_mismatch=True)
    return model


def nvidia_resnet50(pretrained=True, **kwargs):
    """ResNet50 v1.5; ``pretrained`` loads NVIDIA's NGC 20.06 weights (downloaded once into the hub cache)."""
    return _entry("resnet50", pretrained, **kwargs)


def nvidia_resnext101_32x4d(pretrained=True, **kwargs):
    """ResNeXt101-32x4d; ``pretrained`` loads NVIDIA's NGC 20.06 weights."""
    return _entry("resnext101-32x4d", pretrained, **kwargs)


def nvidia_se_resnext101_32x4d(pretrained=True, **kwargs):
    """SE-ResNeXt101-32x4d; ``pretrained`` loads NVIDIA's NGC 20.06 weights."""
    return _entry("se-resnext101-32x4d", pretrained, **kwargs)


def nvidia_efficientnet_b0(pretrained=True, **kwargs):
    """EfficientNet-B0; ``pretrained`` loads NVIDIA's NGC 20.12 weights (downloaded once into the hub cache)."""
    return _entry("efficientnet-b0", pretrained, **kwargs)


def nvidia_efficientnet_b4(pretrained=True, **kwargs):
    """EfficientNet-B4; ``pretrained`` loads NVIDIA's NGC 20.12 weights."""
    return _entry("efficientnet-b4", pretrained, **kwargs)


def nvidia_efficientnet_widese_b0(pretrained=True, **kwargs):
    """EfficientNet-WideSE-B0; ``pretrained`` loads NVIDIA's NGC 20.12 weights."""
    return _entry("efficientnet-widese-b0", pretrained, **kwargs)


def nvidia_efficientnet_widese_b4(pretrained=True, **kwargs):
    """EfficientNet-WideSE-B4; ``pretrained`` loads NVIDIA's NGC 20.12 weights."""
    return _entry("efficientnet-widese-b4", pretrained, **kwargs)


nvidia_resneXt = nvidia_resnext101_32x4d

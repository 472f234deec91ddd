"""Image classification toolkit: ResNet-family training, evaluation, benchmarking and inference."""

__version__ = "0.1.0"

"""Test-time augmentation: a model's logits averaged with its logits on transformed copies of the images, as
validation (``--val-tta``, during training and ``--evaluate``) and classify.py (``--tta``) both predict.  A plain
function of the model and the batch, in float32 whatever the autocast dtype."""

from __future__ import annotations

import torch


def flip_tta(model, images: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Test-time augmentation by flipping (``--val-tta flip``): the mean of ``logits`` (the model's on
    ``images``) and the model's logits on the mirror images, in float32.  FFCV's validation sums the two,
    which ranks the classes alike; the mean keeps the loss on the logits' own scale."""
    mirrored = model(images.flip(-1).contiguous(memory_format=_memory_format(images)))
    return (logits.float() + mirrored.float()) / 2


def _memory_format(images: torch.Tensor) -> torch.memory_format:
    return torch.channels_last if images.dim() == 4 and images.is_contiguous(memory_format=torch.channels_last) \
        and not images.is_contiguous() else torch.contiguous_format

"""Losses, MixUp, CutMix and accuracy as plain functions of their inputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def classification_loss(logits: torch.Tensor, target: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
    """Cross entropy with label smoothing; ``target`` is class ids or soft (MixUp) probabilities.

    Equals the reference's ``(1-s) * nll + s * mean_c(-log p)``, for hard and soft targets alike.
    """
    return F.cross_entropy(logits.float(), target, label_smoothing=smoothing)


def mixup(images: torch.Tensor, targets: torch.Tensor, num_classes: int, lam: float,
          permutation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Blend each sample with ``permutation``'s partner: one ``lam`` for the batch, soft targets out."""
    one_hot = F.one_hot(targets, num_classes).to(images.dtype)
    mixed_images = images.mul(lam).add_(images[permutation], alpha=1.0 - lam)
    mixed_targets = one_hot.mul(lam).add_(one_hot[permutation], alpha=1.0 - lam)
    return mixed_images, mixed_targets


def cutmix(images: torch.Tensor, targets: torch.Tensor, num_classes: int,
           box: tuple[int, int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Paste ``box`` = (x1, y1, x2, y2) of each sample's predecessor in the batch (the last sample's for
    the first) into it, as torchvision's CutMix pairs samples; the soft targets weigh the two labels by
    area, so they still sum to one."""
    x1, y1, x2, y2 = box
    height, width = images.shape[-2:]
    lam = 1.0 - (x2 - x1) * (y2 - y1) / (width * height)
    mixed_images = images.clone()
    mixed_images[..., y1:y2, x1:x2] = images.roll(1, 0)[..., y1:y2, x1:x2]
    one_hot = F.one_hot(targets, num_classes).to(images.dtype)
    mixed_targets = one_hot.roll(1, 0).mul_(1.0 - lam).add_(one_hot.mul(lam))
    return mixed_images, mixed_targets


def correct_counts(logits: torch.Tensor, targets: torch.Tensor, ks: tuple[int, ...]) -> torch.Tensor:
    """How many samples have their target among the top-k logits, for each k (a tensor on the device).

    A sample whose logits are not all finite counts as wrong: NaN would otherwise rank as the top class.
    """
    top = logits.topk(min(max(ks), logits.shape[1]), dim=1).indices
    hits = top.eq(targets.view(-1, 1)) & torch.isfinite(logits).all(dim=1, keepdim=True)
    return torch.stack([hits[:, :k].any(dim=1).sum() for k in ks])

"""What training does to a whole batch on the device, after normalisation: random erasing, then MixUp or
CutMix.

Every backend's batches pass through here, so the flags work the same on pytorch, DALI and synthetic
data.  The draws come from the training process's own generators (numpy's and torch's CPU generator),
which every checkpoint records, so a resumed run draws the same boxes and weights as an uninterrupted one.
``--mixup`` alone draws exactly as before CutMix existed: numpy's beta and a random permutation.
CutMix and random erasing draw exactly as torchvision's ``v2.CutMix`` and ``RandomErasing`` do, from
torch's CPU generator (the boxes are drawn on the host; only the copies run on the device).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torchvision import transforms

from .losses import cutmix, mixup

ERASE_SCALE = (0.02, 0.33)  # torchvision RandomErasing's defaults: area fraction and aspect range
ERASE_RATIO = (0.3, 3.3)


def erase_box(height: int, width: int, p: float) -> tuple[int, int, int, int] | None:
    """(top, left, h, w) of the rectangle torchvision's ``RandomErasing(p)`` erases in one image, or None
    (not erased this time, or no rectangle found in its ten tries)."""
    if not torch.rand(1) < p:
        return None
    like = torch.empty(1).expand(3, height, width)  # get_params reads only the shape
    top, left, h, w, _ = transforms.RandomErasing.get_params(like, scale=ERASE_SCALE, ratio=ERASE_RATIO,
                                                             value=[0.0])
    if (h, w) == (height, width):  # torchvision's "give up": the image is left as it is
        return None
    return top, left, h, w


def random_erase(images: torch.Tensor, p: float) -> torch.Tensor:
    """Each normalised image of ``images`` with probability ``p`` has a random rectangle set to 0 (the
    dataset mean), as torchvision's recipe erases after ``Normalize``.  Returns a new batch: a backend
    may hand out the same tensor again (synthetic data does)."""
    erased = images.clone()
    height, width = images.shape[-2:]
    for image in erased:
        box = erase_box(height, width, p)
        if box is not None:
            top, left, h, w = box
            image[:, top:top + h, left:left + w] = 0
    return erased


def cutmix_box(height: int, width: int, alpha: float) -> tuple[int, int, int, int]:
    """(x1, y1, x2, y2) as torchvision's ``v2.CutMix(alpha=alpha)`` draws it: lambda from Beta(alpha, alpha),
    a centre uniform over the image, sides sqrt(1 - lambda) of the image's, clipped at its edges."""
    lam = float(torch.distributions.Beta(torch.tensor([alpha]), torch.tensor([alpha])).sample(()))
    centre_x = torch.randint(width, size=(1,))
    centre_y = torch.randint(height, size=(1,))
    half = 0.5 * math.sqrt(1.0 - lam)
    half_w, half_h = int(half * width), int(half * height)
    return (int(torch.clamp(centre_x - half_w, min=0)), int(torch.clamp(centre_y - half_h, min=0)),
            int(torch.clamp(centre_x + half_w, max=width)), int(torch.clamp(centre_y + half_h, max=height)))


def augment_batch(images: torch.Tensor, targets: torch.Tensor, *, num_classes: int, mixup_alpha: float = 0.0,
                  cutmix_alpha: float = 0.0, switch_prob: float = 0.5, erase_prob: float = 0.0
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, targets)`` erased and mixed as the flags ask: targets stay class ids when nothing mixes,
    else they are soft labels that sum to one.  With both alphas, a batch is CutMix with probability
    ``switch_prob`` (drawn as timm's ``Mixup`` does), else MixUp."""
    if erase_prob > 0:
        images = random_erase(images, erase_prob)
    use_cutmix = cutmix_alpha > 0 and (mixup_alpha <= 0 or np.random.rand() < switch_prob)
    if use_cutmix:
        box = cutmix_box(images.shape[-2], images.shape[-1], cutmix_alpha)
        return cutmix(images, targets, num_classes, box)
    if mixup_alpha > 0:
        lam = float(np.random.beta(mixup_alpha, mixup_alpha))
        permutation = torch.randperm(images.shape[0], device=images.device)
        return mixup(images, targets, num_classes, lam, permutation)
    return images, targets

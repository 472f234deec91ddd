"""One validation pass's sums, by name: what each batch adds, and the figures of the pass from them.

The sums live in one float64 tensor on the device, so that a batch adds to them without a host sync and the
processes sum them in one collective; :data:`SLOTS` names its entries, and nothing reads them by position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .losses import classification_loss, correct_counts

SLOTS = ("loss", "top1", "topk", "count", "bad")  # loss sum, hits, top-k hits, images, outputs not finite
TTA_SLOTS = ("tta_loss", "tta_top1", "tta_topk", "tta_bad")  # the same of the logits averaged under --val-tta


@dataclass
class ValResult:
    top1: float
    loss: float
    count: int
    not_finite: int  # images whose outputs held NaN or inf (counted as wrong)
    tta_top1: float | None = None  # --val-tta's top1 of the averaged logits, where it has one

    @property
    def finite(self) -> bool:
        """Whether the validation counts: images seen, every output finite, a finite loss."""
        return bool(self.count) and not self.not_finite and math.isfinite(self.loss)

    @property
    def finite_top1(self) -> float | None:
        """top1 when the validation counts; else None."""
        return self.top1 if self.finite else None


def slots(tta: bool) -> tuple[str, ...]:
    """The names of a pass's sums, in the order of their tensor."""
    return SLOTS + TTA_SLOTS if tta else SLOTS


def named(sums: torch.Tensor, tta: bool) -> dict[str, float]:
    """The sums read to the host (one sync), by name."""
    return dict(zip(slots(tta), sums.tolist()))


def _scored(logits: torch.Tensor, targets: torch.Tensor, ks: tuple[int, int]) -> list[torch.Tensor]:
    """[loss sum, top-1 hits, top-k hits, outputs not finite] of a batch, as float64 tensors on the device."""
    loss = classification_loss(logits, targets, 0.0)  # plain cross-entropy, whatever training used
    counts = correct_counts(logits, targets, ks).double()
    not_finite = (~torch.isfinite(logits).all(dim=1)).sum().double()
    return [loss.double() * targets.shape[0], counts[0], counts[1], not_finite]


def batch_sums(logits: torch.Tensor, averaged: torch.Tensor | None, targets: torch.Tensor,
               ks: tuple[int, int]) -> torch.Tensor:
    """A batch's sums in :func:`slots` order (the TTA ones where ``averaged`` is given), on the logits' device."""
    loss, top1, topk, bad = _scored(logits, targets, ks)
    count = torch.tensor(float(targets.shape[0]), dtype=torch.float64, device=logits.device)
    extra = _scored(averaged, targets, ks) if averaged is not None else []
    return torch.stack([loss, top1, topk, count, bad, *extra])


def finite_sums(sums: dict[str, float]) -> bool:
    """Whether every output the sums count was finite, the mirror images' under --val-tta included."""
    return not sums["bad"] and not sums.get("tta_bad", 0.0)


def window_figures(prefix: str, topk: int, sums: dict[str, float]) -> dict[str, float]:
    """A window's (or the pass's) figures per image: top1, top-k and loss, and the TTA ones where they are finite;
    none where an output was not."""
    count = sums["count"]
    if sums["bad"]:
        return {}
    figures = {f"{prefix}.top1": 100.0 * sums["top1"] / count, f"{prefix}.top{topk}": 100.0 * sums["topk"] / count,
               f"{prefix}.loss": sums["loss"] / count}
    if "tta_bad" in sums and not sums["tta_bad"]:
        figures.update({f"{prefix}.tta_top1": 100.0 * sums["tta_top1"] / count,
                        f"{prefix}.tta_top{topk}": 100.0 * sums["tta_topk"] / count,
                        f"{prefix}.tta_loss": sums["tta_loss"] / count})
    return figures


def figure_names(prefix: str, topk: int, tta: bool) -> tuple[str, ...]:
    """The names :func:`window_figures` can give, the TTA ones under --val-tta."""
    names = (f"{prefix}.top1", f"{prefix}.top{topk}", f"{prefix}.loss")
    return names + (f"{prefix}.tta_top1", f"{prefix}.tta_top{topk}", f"{prefix}.tta_loss") if tta else names

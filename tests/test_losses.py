"""Label smoothing, MixUp, accuracy and EMA as plain functions."""

import torch

from image_classification.train.ema import ModelEma, ema_decay
from image_classification.train.losses import classification_loss, correct_counts, mixup


def test_label_smoothing_matches_the_reference_formula():
    torch.manual_seed(0)
    logits, targets, s = torch.randn(6, 5), torch.tensor([0, 1, 2, 3, 4, 0]), 0.1
    logp = logits.log_softmax(-1)
    expected = ((1 - s) * -logp.gather(1, targets[:, None]).squeeze(1) + s * -logp.mean(-1)).mean()
    torch.testing.assert_close(classification_loss(logits, targets, s), expected)


def test_label_smoothing_is_timm_s_where_timm_is_installed():
    """timm's train.py trains with LabelSmoothingCrossEntropy: the same loss, so no gap beside it comes from here."""
    import pytest

    timm_loss = pytest.importorskip("timm.loss")
    torch.manual_seed(2)
    logits, targets = torch.randn(8, 4), torch.randint(0, 4, (8,))
    torch.testing.assert_close(classification_loss(logits, targets, 0.1),
                               timm_loss.LabelSmoothingCrossEntropy(smoothing=0.1)(logits, targets))


def test_soft_targets_with_smoothing_match_the_reference_formula():
    torch.manual_seed(1)
    logits, soft, s = torch.randn(4, 3), torch.softmax(torch.randn(4, 3), -1), 0.1
    logp = logits.log_softmax(-1)
    expected = ((1 - s) * (-logp * soft).sum(-1) + s * -logp.mean(-1)).mean()
    torch.testing.assert_close(classification_loss(logits, soft, s), expected)


def test_mixup_uses_one_lambda_and_gives_soft_targets():
    images = torch.arange(4, dtype=torch.float32).view(4, 1, 1, 1).expand(4, 3, 2, 2).contiguous()
    targets = torch.tensor([0, 1, 2, 0])
    permutation = torch.tensor([1, 0, 3, 2])
    mixed, soft = mixup(images, targets, 3, 0.7, permutation)
    assert mixed[0, 0, 0, 0] == 0.7 * 0 + 0.3 * 1
    torch.testing.assert_close(soft[0], torch.tensor([0.7, 0.3, 0.0]))
    torch.testing.assert_close(soft.sum(-1), torch.ones(4))


def test_correct_counts_for_top1_and_topk():
    logits = torch.tensor([[0.1, 0.5, 0.4], [0.9, 0.05, 0.05], [0.2, 0.3, 0.5]])
    counts = correct_counts(logits, torch.tensor([2, 0, 0]), (1, 2))
    assert counts.tolist() == [1, 2]


def test_ema_warms_up_then_averages_at_the_decay():
    assert ema_decay(0.999, 0) == 0.1 and ema_decay(0.9, 10_000) == 0.9
    model = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    ema = ModelEma(model, 0.5)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema.update(model, step=100)
    torch.testing.assert_close(ema.module.weight, torch.full((1, 2), 0.5))

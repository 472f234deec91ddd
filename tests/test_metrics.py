"""What standard output shows of the loop's records: one short line per print window and per epoch, the figures
that apply to the run in words (the raport keeps every record; tests/test_raport.py)."""

from __future__ import annotations

from image_classification.train.metrics import TRAIN_WINDOW, Console

EPOCH = {  # an epoch record as the loop makes it: both levels, every metric that an FP32 run without EMA has
    "train.loss": 1.234, "train.total_ips": 1234.4, "train.compute_ips": 1500.0, "train.lr": 0.1,
    "train.grad_scale": 1.0, "train.image_size": 224, "val.top1": 50.2, "val.top5": 77.1, "val.loss": 1.1,
    "val.total_ips": 3456.0, "val.compute_ips": 4000.0, "val.compute_latency": 0.0123,
    "train.data_time": 0.01, "train.compute_time": 0.2, "val.data_time": 0.001, "val.compute_time": 0.0123,
    "val.compute_latency_at90": 0.013, "val.compute_latency_at100": 0.02,
}


def test_an_epoch_is_one_line_of_the_figures_that_apply_to_the_run():
    console = Console(90, 5)
    assert console([2], EPOCH) == \
        "Epoch 3/90: train loss 1.2340, 1,234 img/s, lr 0.1; val loss 1.1000, top1 50.20%, top5 77.10%"
    ema = {**EPOCH, "val_ema.top1": 51.0, "val_ema.top5": 78.0, "val_ema.loss": 1.05, "val_ema.total_ips": 3000.0}
    assert console([2], ema).endswith("; val_ema loss 1.0500, top1 51.00%, top5 78.00%")
    scheduled = Console(90, 5, crop_schedule=True)  # --progressive-resize: the epoch's crops change
    assert scheduled([2], EPOCH).startswith("Epoch 3/90: train loss 1.2340, 1,234 img/s, lr 0.1, crops 224 px; val ")


def test_a_print_window_is_one_short_line_with_the_loss_scale_only_where_fp16_scales_the_loss():
    window = {"train.loss": 2.5, "train.total_ips": 28.84, "train.compute_ips": 30.0, "train.lr": 0.003125,
              "train.grad_scale": 65536.0}
    fp32, fp16 = Console(90, 5), Console(90, 5, loss_scaling=True)
    fp32.lengths["train"] = fp16.lengths["train"] = 5004
    assert fp32([0, 200], window) == "Epoch 1/90 [ 200/5004] loss 2.5000, 28.8 img/s, lr 0.003125"
    assert fp16([0, 200], window) == "Epoch 1/90 [ 200/5004] loss 2.5000, 28.8 img/s, lr 0.003125, loss scale 65536"
    assert "scale" not in fp16([0], {**EPOCH, "train.grad_scale": 65536.0})  # an epoch's mean scale says nothing
    validation = {"val.top1": 66.666, "val.top5": 100.0, "val.loss": 0.5, "val.total_ips": 123.4,
                  "val.compute_latency": 0.01}
    fp32.lengths["val"] = 12
    assert fp32([0, 5004, 3], validation) == "Epoch 1/90 val [ 3/12] loss 0.5000, top1 66.67%, top5 100.00%, 123 img/s"
    assert fp32([0, 5004, 3], {"val.total_ips": 99.94}) == "Epoch 1/90 val [ 3/12] 99.9 img/s"  # no figure so far


def test_an_evaluation_says_whose_weights_with_its_throughput_and_latency_and_no_summary():
    console = Console(90, 5, evaluation=True)
    evaluated = {name: value for name, value in EPOCH.items() if name.startswith("val.")}
    assert console([5], evaluated) == ("Evaluation (weights of epoch 5): val loss 1.1000, top1 50.20%, top5 77.10%, "
                                       "3,456 img/s, latency 12.3 ms a batch")
    assert console([0], evaluated).startswith("Evaluation: val loss")  # weights of no epoch of ours
    assert console([], evaluated) is None


def test_the_run_s_summary_gives_its_best_figures_and_its_throughput_not_its_last_lr():
    line = Console(90, 5)([], EPOCH)
    assert line == ("Summary (each figure's best epoch; throughput over the run): train loss 1.2340, 1,234 img/s; "
                    "val loss 1.1000, top1 50.20%, top5 77.10%")


def test_a_validation_without_a_figure_says_why_and_flip_tta_figures_are_named():
    console = Console(90, 3)
    assert console([0], {"train.loss": 1.0, "val.not_finite": 1200.0}) == \
        "Epoch 1/90: train loss 1.0000; val no accuracy (the outputs of 1,200 images were NaN or inf)"
    tta = {"val.top1": 50.0, "val.top3": 70.0, "val.tta_top1": 52.0, "val.tta_top3": 71.0, "val.loss": 1.0}
    assert console([0], tta) == "Epoch 1/90: val loss 1.0000, top1 50.00%, top3 70.00%, flip TTA top1 52.00%, " \
        "flip TTA top3 71.00%"
    assert Console(90, 1)([0], {"val.top1": 50.0}) == "Epoch 1/90: val top1 50.00%"  # --topk 1: said once
    assert Console(90, 5)("PARAMETER", {"lr": 0.1}) is None and Console(90, 5)([0], {}) is None


def test_the_benchmarks_find_a_training_window_s_line_by_its_epoch_and_iteration_alone():
    """benchmarks/peer_timm.py and startup.py time main.py's steps by TRAIN_WINDOW: a validation's window, an
    epoch's line and the summary are not steps."""
    console = Console(2, 5)
    console.lengths.update(train=250, val=10)
    lines = [console([1, 30], {"train.loss": 1.0, "train.total_ips": 50.0}),
             console([1, 250, 3], {"val.top1": 1.0}), console([1], {"train.loss": 1.0}), console([], {"train.loss": 1.0})]
    assert [(match[1], match[2]) for line in lines if (match := TRAIN_WINDOW.match(line))] == [("2", "30")]

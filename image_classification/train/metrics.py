"""The metrics the training loop records in the raport: their registration, one iteration's times and
throughputs, which iterations a warm-up (``--benchmark-warmup``) leaves out of the epochs' and the
summary's figures, and what standard output shows of them (:class:`Console`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..records.raport import ACC_META, COUNT_META, LOSS_META, LR_META, PERF_META, SIZE_META, TIME_META, VERBOSE, Raport

LATENCY_PERCENTILES = (90, 95, 99, 100)
# A training window's line as :class:`Console` prints it, by its epoch (from 1) and iteration: what the benchmarks
# that run main.py time its steps by
TRAIN_WINDOW = re.compile(r"^Epoch (\d+)/\d+ \[ *(\d+)(?:/\d+)?\] ")


def register_metrics(raport: Raport, prefixes: list[str], topk: int, training: bool, warmup: int = 0,
                     pass_counts: tuple[str, ...] = (), tta: bool = False) -> None:
    """Every metric the loop records; with ``warmup`` (``--benchmark-warmup``) also ``*.wall_ips``; each of the
    loaders' ``pass_counts`` (:meth:`..data.Loader.pass_counts`) once per phase, an epoch's sum of its passes; with
    ``tta`` (``--val-tta``) each validation's figures of the averaged logits, ``*.tta_top1`` ..., beside the plain
    ones."""

    def times(prefix: str) -> None:  # what record_iteration records for every phase
        raport.register(f"{prefix}.total_ips", "perf", PERF_META)
        if warmup:
            raport.register(f"{prefix}.wall_ips", "perf", PERF_META)
        raport.register(f"{prefix}.compute_ips", "perf", PERF_META)
        raport.register(f"{prefix}.data_time", "perf", TIME_META, VERBOSE)
        raport.register(f"{prefix}.compute_time", "perf", TIME_META, VERBOSE)

    if training:
        raport.register("train.loss", "loss", LOSS_META)
        times("train")
        raport.register("train.lr", "lr", LR_META)
        raport.register("train.grad_scale", "perf", LOSS_META)
        raport.register("train.image_size", "last", SIZE_META)  # the epoch's crop side (--progressive-resize)
    for prefix in prefixes:  # a validation window's accuracy and loss: the figure so far, as readers take it
        raport.register(f"{prefix}.top1", "acc", ACC_META, running=True)
        raport.register(f"{prefix}.top{topk}", "acc", ACC_META, running=True)
        raport.register(f"{prefix}.loss", "loss", LOSS_META, running=True)
        if tta:
            raport.register(f"{prefix}.tta_top1", "acc", ACC_META, running=True)
            raport.register(f"{prefix}.tta_top{topk}", "acc", ACC_META, running=True)
            raport.register(f"{prefix}.tta_loss", "loss", LOSS_META, running=True)
        times(prefix)
        raport.register(f"{prefix}.compute_latency", "perf", TIME_META)
        for q in LATENCY_PERCENTILES:
            raport.register(f"{prefix}.compute_latency_at{q}", f"q{q}", TIME_META, VERBOSE)
        raport.register(f"{prefix}.not_finite", "acc", COUNT_META)  # recorded only for a validation that is not finite
    for phase in (["train"] if training else []) + prefixes:
        for name in pass_counts:
            raport.register(f"{phase}.{name}", "sum", COUNT_META)


@dataclass
class Warmup:
    """Which iterations count in a phase's throughput: all but the first ``length``."""

    length: int
    seen: int = 0
    measured: int = 0

    def next(self) -> bool:
        """Count one more iteration; whether it is measured (past the warm-up)."""
        self.seen += 1
        self.measured += self.seen > self.length
        return self.seen > self.length


def record_iteration(raport: Raport, prefix: str, *, data_time: float, iteration_time: float, images: int,
                     measured: bool, latency: float | None = None) -> None:
    """One iteration's times and throughputs (wall clock to wall clock); an iteration of the warm-up is
    logged in its window but left out of the epoch's and the run's figures, which ``{prefix}.wall_ips``
    (registered with a warm-up only) keeps whole."""
    iteration_time = max(iteration_time, 1e-9)
    compute_time = max(iteration_time - data_time, 1e-9) if latency is None else max(latency, 1e-9)
    raport.record(f"{prefix}.data_time", data_time, epoch=measured)
    raport.record(f"{prefix}.compute_time", compute_time, epoch=measured)
    if latency is not None:
        raport.record(f"{prefix}.compute_latency", compute_time, epoch=measured)
        for q in LATENCY_PERCENTILES:
            raport.record(f"{prefix}.compute_latency_at{q}", compute_time, epoch=measured)
    raport.record(f"{prefix}.total_ips", images / iteration_time, iteration_time, epoch=measured)
    raport.record(f"{prefix}.compute_ips", images / compute_time, compute_time, epoch=measured)
    if f"{prefix}.wall_ips" in raport.metrics:
        raport.record(f"{prefix}.wall_ips", images / iteration_time, iteration_time, window=False)


def _rate(images_per_s: float) -> str:
    """``28.8 img/s``, ``1,234 img/s``: a decimal only where the figure is small."""
    return f"{images_per_s:,.0f} img/s" if images_per_s >= 100 else f"{images_per_s:.1f} img/s"


class Console:
    """What a person reads of the loop's records (the raport keeps them all): per print window one short line,
    ``Epoch 3/90 [ 200/5004] loss 2.3456, 1,234 img/s, lr 0.1``, per epoch one, ``Epoch 3/90: train loss
    2.3456, 1,234 img/s, lr 0.1; val loss 1.9876, top1 55.12%, top5 79.34%``, and one for the run; only the
    figures a run has (the fp16 loss scale with loss scaling alone, the epoch's crop size with a
    ``--progressive-resize`` schedule alone, ``val_ema`` with an EMA alone).

    ``epochs``: the run's schedule; ``evaluation``: an ``--evaluate`` run, whose one validation is named so,
    with the epoch its weights ended (its records' epoch: the count they trained), and which gives no summary
    line (its epoch line says it all); ``lengths``: each phase's (``train``, ``val``, ``val_ema``) pass length,
    as the loop began it last.
    """

    def __init__(self, epochs: int, topk: int, *, loss_scaling: bool = False, crop_schedule: bool = False,
                 evaluation: bool = False):
        self.epochs, self.topk, self.loss_scaling, self.evaluation = epochs, topk, loss_scaling, evaluation
        self.crop_schedule = crop_schedule
        self.lengths: dict[str, int] = {}

    def __call__(self, step, values: dict[str, float]) -> str | None:
        if isinstance(step, str) or not values:
            return None
        if not step:
            return None if self.evaluation else \
                f"Summary (each figure's best epoch; throughput over the run): {self._phases(values, epoch=False)}"
        if self.evaluation:
            where = f"Evaluation (weights of epoch {step[0]})" if step[0] > 0 else "Evaluation"
        else:
            where = f"Epoch {step[0] + 1}/{self.epochs}"
        if len(step) == 1:
            return f"{where}: {self._phases(values, epoch=True)}"
        phase = next(iter(values)).split(".")[0]
        total = self.lengths.get(phase, 0)
        position = f"[{step[-1]:>{len(str(total))}}/{total}]" if total else f"[{step[-1]}]"
        figures = self._figures(phase, values, window=True)
        return f"{where}{'' if phase == 'train' else ' ' + phase} {position}" + (f" {figures}" if figures else "")

    def _phases(self, values: dict[str, float], *, epoch: bool) -> str:
        phases = dict.fromkeys(name.split(".")[0] for name in values)
        parts = [f"{phase} {figures}" for phase in phases
                 if (figures := self._figures(phase, values, window=False, epoch=epoch))]
        return "; ".join(parts)

    def _figures(self, phase: str, values: dict[str, float], *, window: bool, epoch: bool = False) -> str:
        """One phase's figures, in words: the loss, the accuracy, the throughput, then what applies to it."""
        def get(name: str) -> float | None:
            return values.get(f"{phase}.{name}")

        parts = [] if get("loss") is None else [f"loss {get('loss'):.4f}"]
        if get("not_finite") is not None:
            parts.append(f"no accuracy (the outputs of {get('not_finite'):,.0f} images were NaN or inf)")
        for name in dict.fromkeys(("top1", f"top{self.topk}", "tta_top1", f"tta_top{self.topk}")):
            if get(name) is not None:
                parts.append(f"{name.replace('tta_', 'flip TTA ')} {get(name):.2f}%")
        # a training run's validation says its accuracy; its throughput is in the windows and the raport
        show_rate = phase == "train" or window or self.evaluation
        if show_rate and get("total_ips") is not None:
            parts.append(_rate(get("total_ips")))
        if phase == "train" and get("lr") is not None and (window or epoch):
            parts.append(f"lr {get('lr'):.6g}")
        if phase == "train" and epoch and self.crop_schedule and get("image_size") is not None:
            parts.append(f"crops {get('image_size'):.0f} px")
        if phase == "train" and window and self.loss_scaling and get("grad_scale") is not None:
            parts.append(f"loss scale {get('grad_scale'):g}")
        if self.evaluation and not window and get("compute_latency") is not None:
            parts.append(f"latency {1000 * get('compute_latency'):.1f} ms a batch")
        return ", ".join(parts)

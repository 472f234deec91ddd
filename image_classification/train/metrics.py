"""The metrics the training loop records in the raport: their registration, one iteration's times and
throughputs, and which iterations a warm-up (``--benchmark-warmup``) leaves out of the epochs' and the
summary's figures."""

from __future__ import annotations

from dataclasses import dataclass

from ..records.raport import ACC_META, COUNT_META, LOSS_META, LR_META, PERF_META, SIZE_META, TIME_META, VERBOSE, Raport

LATENCY_PERCENTILES = (90, 95, 99, 100)


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

"""How infer_throughput.py times its paths and sums them up: each batch uploaded once, before any timing;
each timed call with the device synchronised just before and after it; the rounds alternating the paths;
the outputs compared with the baseline's outside the timed calls.  Also the FP32 ceiling of this CPU: the
model's FLOPs at the rate of a dense FP32 matrix product.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from benchmarks.common import percentile, ratio_spread, verdict
from benchmarks.infer_paths import BASELINE, Path_
from image_classification.models import build_model

def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(work: Callable[[], object], device: torch.device) -> float:
    """Seconds ``work`` takes, the device synchronised just before and just after it."""
    _synchronize(device)
    start = time.perf_counter()
    work()
    _synchronize(device)
    return time.perf_counter() - start


def _logits(output: object) -> torch.Tensor:
    """A path's output as float logits on the host, to compare (never inside a timed region)."""
    return torch.as_tensor(output).float().cpu()


def _compare(paths: list[Path_], images: torch.Tensor) -> None:
    """Every path's logits on ``images`` against the first path's: largest difference, top-1 agreement."""
    reference = _logits(paths[0].forward(images))
    for path in paths[1:]:
        logits = _logits(path.forward(images))
        path.max_abs_diff = max(path.max_abs_diff, float((logits - reference).abs().max()))
        path.agreeing += int((logits.argmax(1) == reference.argmax(1)).sum())
        path.compared += len(reference)


def measure_paths(paths: list[Path_], batch_sizes: Sequence[int], image_size: int, device: torch.device,
                  iters: int, warmup: int, repeats: int) -> None:
    """Time every runnable path at every batch size; then compare each path's outputs with the first's."""
    live = [p for p in paths if p.skipped is None]
    generator = torch.Generator().manual_seed(0)
    for batch_size in batch_sizes:
        # Uploaded once: the timed calls get a batch already on the device, as a pipelined server's model does.
        images = torch.randn(batch_size, 3, image_size, image_size, generator=generator).to(device)
        for path in live:
            start = time.perf_counter()
            if path.for_batch_size is not None:
                path.forward = path.for_batch_size(batch_size)
            for _ in range(max(warmup, path.min_warmup)):
                path.forward(images)
            _synchronize(device)
            path.warmup_seconds[batch_size] = time.perf_counter() - start
            path.latencies[batch_size] = []
        for round_index in range(repeats):
            shift = round_index % len(live)
            for path in live[shift:] + live[:shift]:
                path.latencies[batch_size] += [_timed(lambda: path.forward(images), device) for _ in range(iters)]
        if len(live) > 1:
            _compare(live, images)


def transfer_times(batch_size: int, image_size: int, num_classes: int, device: torch.device,
                   iters: int) -> dict[str, float]:
    """Median ms to upload a batch from pinned memory and to download its logits into pinned memory, both
    non-blocking (CUDA): what a server pays besides the model, kept out of the paths' figures."""
    host = torch.randn(batch_size, 3, image_size, image_size).pin_memory()
    logits = torch.empty(batch_size, num_classes, device=device)
    back = torch.empty(logits.shape, pin_memory=True)
    upload, download = [], []
    for _ in range(iters + 1):  # the first of each is a warm-up
        upload.append(_timed(lambda: host.to(device, non_blocking=True), device))
        download.append(_timed(lambda: back.copy_(logits, non_blocking=True), device))
    return {"upload_ms": 1e3 * percentile(upload[1:], 50), "download_ms": 1e3 * percentile(download[1:], 50)}


def _round_rates(latencies: list[float], batch_size: int, repeats: int) -> list[float]:
    """images/s of each round (the latencies are in round order, the same count per round)."""
    per_round = len(latencies) // max(repeats, 1)
    return [batch_size * per_round / sum(latencies[i:i + per_round]) for i in range(0, per_round * repeats, per_round)]


def summary(paths: list[Path_], batch_sizes: Sequence[int], repeats: int = 1) -> dict:
    baseline_rate, baseline_rounds = {}, {}
    table: dict[str, dict] = {}
    for path in paths:
        if path.skipped:
            table[path.name] = {"dtype": path.dtype, "skipped": path.skipped}
            continue
        entry: dict = {"dtype": path.dtype}
        for batch_size in batch_sizes:
            latencies = path.latencies[batch_size]
            rate = batch_size * len(latencies) / sum(latencies)
            rounds = _round_rates(latencies, batch_size, repeats)
            if path.name == BASELINE:
                baseline_rate[batch_size], baseline_rounds[batch_size] = rate, rounds
            spread = ratio_spread(rounds, baseline_rounds[batch_size])  # the paths alternate within a round
            entry[str(batch_size)] = {
                "p50_ms": 1e3 * percentile(latencies, 50), "p90_ms": 1e3 * percentile(latencies, 90),
                "p99_ms": 1e3 * percentile(latencies, 99), "images_per_s": rate,
                "speedup": rate / baseline_rate[batch_size], "warmup_seconds": path.warmup_seconds[batch_size],
                "batches": len(latencies), "speedup_spread": spread,
                "verdict": verdict(rate / baseline_rate[batch_size], spread),
            }
        if path.compared:
            entry.update(max_abs_diff=path.max_abs_diff, top1_agreement=path.agreeing / path.compared,
                         compared_images=path.compared)
        table[path.name] = entry
    return table


def best_paths(table: dict, batch_sizes: Sequence[int]) -> dict[str, str]:
    """The path with the most images/s at each batch size (the baseline excluded)."""
    best = {}
    for batch_size in batch_sizes:
        rates = {name: entry[str(batch_size)]["images_per_s"] for name, entry in table.items()
                 if name != BASELINE and str(batch_size) in entry}
        if rates:
            best[str(batch_size)] = max(rates, key=rates.get)
    return best


# ------------------------------------------------------------------------------------------------
# The FP32 ceiling of this CPU
# ------------------------------------------------------------------------------------------------
def model_gflop(arch: str, image_size: int) -> float:
    """Floating-point operations of one image's forward pass, in GFLOP: the convolutions and the fc layer,
    two per multiply-add, counted by ``torch.utils.flop_counter`` on the meta device (no weights, no data)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = build_model(arch, num_classes=1000).eval()
        images = torch.empty(1, 3, image_size, image_size)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(images)
    return counter.get_total_flops() / 1e9


def gemm_gflops(size: int = 2048, trials: int = 5) -> float:
    """The FP32 rate of this process's threads on the CPU, in GFLOP/s: the best of ``trials`` timings of a
    ``size`` x ``size`` matrix product, the densest work a CPU does and close to its peak."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # the first call pays for the library's set-up
    best = min(_timed(lambda: a @ b, torch.device("cpu")) for _ in range(trials))
    return 2 * size ** 3 / best / 1e9


def fp32_ceiling(arch: str, image_size: int) -> dict:
    """The images/s no FP32 path can much exceed on this CPU: the model's GFLOP per image at the rate of a
    dense FP32 matrix product.  A path near it is limited by the arithmetic, not by its implementation."""
    gflop, rate = model_gflop(arch, image_size), gemm_gflops()
    return {"gflop_per_image": gflop, "gemm_gflops": rate, "images_per_s": rate / gflop}

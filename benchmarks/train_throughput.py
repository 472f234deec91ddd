"""Training-step throughput: the package's ``Engine.train_step`` on each path against the loop a user writes.

Every side trains the same model (same architecture, same initial weights) on the same synthetic batch
held on the device, in one process. The baseline, ``plain``, is a plain Python loop with
``torch.optim.SGD``, ``nn.CrossEntropyLoss`` and autocast (plus a ``GradScaler`` for fp16) where the
precision asks for it, on an NCHW model: what a user writes. Ours drives
:class:`image_classification.train.engine.Engine` as main.py's loop does, on each path of ``--paths``:
``eager`` (NCHW), ``channels_last`` (``--memory-format nhwc``) and ``compile`` (``--compile``, NCHW),
all at the precision the flags ask for. Each side first runs ``--warmup`` untimed iterations (their time,
compilation included, is reported); then ``--repeats`` rounds each time ``--iters`` iterations of every
side, interleaved (the order rotates from round to round), each synchronised with the device only at its
end. The JSON holds every round's images/s per side, their median and spread, each path's ratio of
medians over ``plain`` with its verdict (none when the rounds' spread is larger than the difference) and,
where ``eager`` ran too, the other paths' over ``eager`` (what the layout or the compiler alone gives), the
device and the software versions; on the CPU also a profile of the plain loop: the share of its operator
time spent in convolutions, and so the most any path that runs the same convolutions could gain.
With ``--largest-batch``, ``-b`` is the largest batch tried: a run that runs out of device memory is made
again at half the batch until one fits, and the JSON lists the batches that did not. Example::

    python benchmarks/train_throughput.py -a resnet50 --image-size 128 -b 16 -o /tmp/train_resnet50_128.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.common import (command_line, compiler_missing, environment, largest_fitting,  # noqa: E402
                               ratio_spread, ratio_text, summarise, verdict, write_json)
from image_classification.arguments.data import DataConfig  # noqa: E402
from image_classification.arguments.model import ModelConfig  # noqa: E402
from image_classification.arguments.optimisation import OptimConfig  # noqa: E402
from image_classification.arguments.run import RunSettings  # noqa: E402
from image_classification.errors import UserError  # noqa: E402
from image_classification.models import build_model, list_models  # noqa: E402
from image_classification.models.preprocessing import Preprocessing  # noqa: E402
from image_classification.system.cli import run  # noqa: E402
from image_classification.system.cli import UserErrorParser, positive_int  # noqa: E402
from image_classification.system.runtime import Runtime, make_runtime  # noqa: E402
from image_classification.train.engine import Engine  # noqa: E402
from image_classification.train.plan import RunConfig  # noqa: E402

LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 1e-4
KINETO_SILENT = 6  # above Kineto's highest log level (VERBOSE 0 ... ERROR 4, USDT 5)
Step = Callable[[], None]
PATHS = ("eager", "channels_last", "compile")


def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="train_throughput.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("-a", "--arch", default="resnet18", choices=list_models(), metavar="ARCH",
                        help="model architecture (default: resnet18)")
    parser.add_argument("--image-size", type=positive_int, default=64, metavar="S", help="input size (default: 64)")
    parser.add_argument("-b", "--batch-size", type=positive_int, default=16, metavar="N", help="batch (default: 16)")
    parser.add_argument("--largest-batch", action="store_true",
                        help="-b is the largest batch tried: where a run of it runs out of device memory, it is "
                        "run again at half the batch, until one fits (the JSON lists the batches that did not)")
    parser.add_argument("--num-classes", type=positive_int, default=1000, metavar="N",
                        help="classifier size (default: 1000)")
    parser.add_argument("--iters", type=positive_int, default=10, metavar="N",
                        help="timed iterations per side and round (default: 10)")
    parser.add_argument("--warmup", type=int, default=3, metavar="N",
                        help="untimed iterations per side before the rounds (default: 3)")
    parser.add_argument("--repeats", type=positive_int, default=5, metavar="N", help="rounds (default: 5)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where to run (default: auto, CUDA when present)")
    parser.add_argument("--amp", action="store_true",
                        help="mixed precision: fp16 autocast with a loss scaler on CUDA, bf16 on the CPU")
    parser.add_argument("--amp-dtype", choices=("float16", "bfloat16"), default=None,
                        help="autocast dtype with --amp (default: float16 on CUDA, bfloat16 on the CPU)")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS), metavar="PATH",
                        help=f"our paths to time against the plain loop: {', '.join(PATHS)} (default: all)")
    parser.add_argument("--label-smoothing", type=float, default=0.0, metavar="S",
                        help="label smoothing of the loss on both sides (default: 0)")
    parser.add_argument("-o", "--output", metavar="FILE", default=None, help="JSON file to write")
    return parser


def make_engine(args: argparse.Namespace, runtime: Runtime, model: nn.Module, compile: bool = False) -> Engine:
    config = RunConfig(ModelConfig(arch=args.arch, num_classes=args.num_classes, compile=compile),
                       OptimConfig(lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY,
                                   label_smoothing=args.label_smoothing),
                       DataConfig(batch_size=args.batch_size, preprocessing=Preprocessing(args.image_size)),
                       run=RunSettings(print_freq=10**9))
    engine = Engine(config, runtime, model, log=lambda *_: None)
    engine.set_lr(0)
    return engine


def ours_step(engine: Engine, images: torch.Tensor, targets: torch.Tensor) -> tuple[Step, Step]:
    """(one training iteration, the end of a timed run) the way main.py's loop drives the engine."""
    def step() -> None:
        engine.train_step(images, targets, accumulation=1, step_now=True)

    def finish() -> None:
        engine.read_window("the benchmark")  # the loop's one synchronisation per print window

    return step, finish


def plain_step(args: argparse.Namespace, runtime: Runtime, model: nn.Module, images: torch.Tensor,
               targets: torch.Tensor) -> tuple[Step, Step]:
    """(one training iteration, the end of a timed run) as a user writes them with torch alone."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    dtype = runtime.amp_dtype
    scaler = torch.amp.GradScaler(runtime.device.type) if dtype == torch.float16 else None
    autocast = (lambda: torch.autocast(runtime.device.type, dtype=dtype)) if dtype else contextlib.nullcontext
    losses: list[torch.Tensor] = []

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = criterion(model(images), targets)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        losses.append(loss.detach())

    def finish() -> None:
        torch.stack(losses).float().mean().item()  # synchronised once, at the end
        losses.clear()

    return step, finish


def timed(step: Step, finish: Step, iterations: int, runtime: Runtime) -> float:
    """Seconds for ``iterations`` steps and the closing synchronisation."""
    runtime.synchronize()
    start = time.perf_counter()
    for _ in range(iterations):
        step()
    finish()
    runtime.synchronize()
    return time.perf_counter() - start


def convolution_shares(step: Step, finish: Step, iterations: int = 2) -> dict[str, float]:
    """Where the plain loop's CPU operator time goes (``torch.profiler``, self time of each operator over
    ``iterations`` steps): the share of the convolutions forward and backward, the work that no layout or
    fusion removes, and ``bound``, the largest speed-up a path could reach by removing everything else."""
    from torch.profiler import ProfilerActivity, profile

    # Kineto, the profiler's library, logs to stderr when it starts and stops ("USDT: ... profiler_start") and,
    # on a machine without a GPU, "ERROR: gpuGetDeviceCount failed with code 35" (CUDA's "no driver"): none
    # of it ours, none of it a problem.  It reads the level when it first starts; a level the user set stays.
    os.environ.setdefault("KINETO_LOG_LEVEL", str(KINETO_SILENT))
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(iterations):
            step()
        finish()
    forward = backward = total = 0.0
    for event in profiler.key_averages():
        total += event.self_cpu_time_total
        if "conv" in event.key and "backward" in event.key:
            backward += event.self_cpu_time_total
        elif "conv" in event.key:
            forward += event.self_cpu_time_total
    forward, backward = forward / total, backward / total
    return {"conv_forward": forward, "conv_backward": backward, "bound": 1 / (forward + backward)}


def path_runtime(runtime: Runtime, path: str) -> Runtime:
    """The runtime a path trains with: channels-last for ``channels_last``, main.py's default NCHW else."""
    layout = torch.channels_last if path == "channels_last" else torch.contiguous_format
    return dataclasses.replace(runtime, memory_format=layout)


def measure(args: argparse.Namespace) -> dict:
    runtime = make_runtime(args.device, amp=args.amp, amp_dtype=args.amp_dtype, log=lambda *_: None)
    if "compile" in args.paths and (missing := compiler_missing(runtime.device)):
        raise UserError(f"--paths compile: {missing}; leave compile out of --paths")
    torch.manual_seed(0)
    initial = build_model(args.arch, num_classes=args.num_classes)
    generator = torch.Generator().manual_seed(1)
    batch = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=generator)
    targets = torch.randint(0, args.num_classes, (args.batch_size,), generator=generator).to(runtime.device)

    def on_device(model: nn.Module, layout: torch.memory_format) -> tuple[nn.Module, torch.Tensor]:
        model = copy.deepcopy(model).to(runtime.device, memory_format=layout).train()
        return model, batch.to(runtime.device).contiguous(memory_format=layout)

    model, images = on_device(initial, torch.contiguous_format)
    sides = {"plain": plain_step(args, runtime, model, images, targets)}
    for path in args.paths:
        ours = path_runtime(runtime, path)
        model, images = on_device(initial, ours.memory_format)
        sides[path] = ours_step(make_engine(args, ours, model, compile=path == "compile"), images, targets)

    warmup = {name: timed(*side, args.warmup, runtime) if args.warmup > 0 else 0.0 for name, side in sides.items()}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for _ in range(args.repeats):
        for name in order:
            seconds = timed(*sides[name], args.iters, runtime)
            rates[name].append(args.iters * args.batch_size / seconds)
        order = order[1:] + order[:1]  # no side always runs first

    plain = summarise(rates["plain"])
    if runtime.device.type == "cpu":  # on CUDA the host's operator time says little about the device's
        plain["profile"] = convolution_shares(*sides["plain"])
    paths = {}
    for path in args.paths:
        stats = summarise(rates[path])
        ratio = stats["median"] / plain["median"]
        # the rounds' own ratios (each round runs every side): a ratio inside their spread is no verdict
        spread = ratio_spread(rates[path], rates["plain"])
        paths[path] = {**stats, "ratio": ratio, "ratio_spread": spread, "verdict": verdict(ratio, spread)}
        if path != "eager" and "eager" in rates:  # the same step in another layout or compiled: what that alone gives
            over = stats["median"] / statistics.median(rates["eager"])
            over_spread = ratio_spread(rates[path], rates["eager"])
            paths[path]["over_eager"] = {"ratio": over, "ratio_spread": over_spread,
                                         "verdict": verdict(over, over_spread)}
    precision = "fp32" if runtime.amp_dtype is None else str(runtime.amp_dtype).replace("torch.", "")
    return {
        "benchmark": "train_throughput",
        "command": command_line(),
        "config": {"arch": args.arch, "image_size": args.image_size, "batch_size": args.batch_size,
                   "num_classes": args.num_classes, "iters": args.iters, "warmup": args.warmup,
                   "repeats": args.repeats, "precision": precision, "paths": list(args.paths),
                   "label_smoothing": args.label_smoothing},
        "environment": environment(runtime.device),
        "unit": "images/s",
        "warmup_seconds": warmup,
        "plain": plain,
        "paths": paths,
        "best": max(paths, key=lambda name: paths[name]["median"]),
    }


def measure_largest(args: argparse.Namespace) -> dict:
    """:func:`measure` at ``-b``, halved on out-of-memory until it fits; the config records the batches
    that did not fit."""
    batch_size, result, too_large = largest_fitting(
        lambda batch: measure(argparse.Namespace(**{**vars(args), "batch_size": batch})), args.batch_size)
    result["config"]["largest_batch"] = {"tried_from": args.batch_size, "out_of_memory_at": too_large}
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = measure_largest(args) if args.largest_batch else measure(args)
    config, plain = result["config"], result["plain"]
    print(f"{config['arch']} {config['image_size']} px, batch {config['batch_size']}, {config['precision']} on "
          f"{result['environment']['machine']}")
    too_large = config.get("largest_batch", {}).get("out_of_memory_at")
    if too_large:
        print(f"  batches {', '.join(map(str, too_large))} ran out of device memory")
    for name, stats in (("plain", plain), *result["paths"].items()):
        line = (f"  {name:>13}: {stats['median']:8.1f} img/s median of {len(stats['values'])} "
                f"(spread {100 * stats['relative_spread']:.1f}%), warm-up {result['warmup_seconds'][name]:.2f} s")
        if name != "plain":
            line += f", vs plain {ratio_text(stats['ratio'], stats['ratio_spread'])}"
        if "over_eager" in stats:
            line += f", vs eager {ratio_text(stats['over_eager']['ratio'], stats['over_eager']['ratio_spread'])}"
        print(line)
    profile = plain.get("profile")
    if profile:
        print(f"  convolutions take {profile['conv_forward'] + profile['conv_backward']:.0%} of the plain loop's "
              f"operator time (forward {profile['conv_forward']:.0%}, backward {profile['conv_backward']:.0%}): "
              f"removing everything else would make it at most {profile['bound']:.2f}x faster")
    write_json(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))

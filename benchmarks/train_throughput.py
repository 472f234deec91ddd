"""Training-step throughput: the package's ``Engine.train_step`` against the loop a user would write.

Both sides train the same model (same architecture, same initial weights) on the same synthetic batch
held on the device, in one process: ours through :class:`image_classification.engine.Engine` with the
options under test (precision, memory format, label smoothing), the baseline as a plain Python loop with
``torch.optim.SGD``, ``nn.CrossEntropyLoss`` and autocast (plus a ``GradScaler`` for fp16) where the
precision asks for it. Each side first runs ``--warmup`` untimed iterations (their time is reported);
then ``--repeats`` rounds each time ``--iters`` iterations of both sides, interleaved (the order
alternates from round to round), each synchronised with the device only at its end. The JSON holds
every round's images/s, their median and spread, the ratio of the medians (ours / plain), the device
and the software versions. Example::

    python benchmarks/train_throughput.py -a resnet50 --image-size 128 -b 16 -o train_resnet50_128.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.common import command_line, environment, summarise, write_json  # noqa: E402
from image_classification.cli import UserErrorParser, positive_int  # noqa: E402
from image_classification.cli import run  # noqa: E402
from image_classification.engine import Engine  # noqa: E402
from image_classification.plan import RunConfig  # noqa: E402
from image_classification.models import build_model, list_models  # noqa: E402
from image_classification.preprocessing import Preprocessing  # noqa: E402
from image_classification.runtime import Runtime, make_runtime  # noqa: E402

LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 1e-4
Step = Callable[[], None]


def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="train_throughput.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("-a", "--arch", default="resnet18", choices=list_models(), metavar="ARCH",
                        help="model architecture (default: resnet18)")
    parser.add_argument("--image-size", type=positive_int, default=64, metavar="S", help="input size (default: 64)")
    parser.add_argument("-b", "--batch-size", type=positive_int, default=16, metavar="N", help="batch (default: 16)")
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
    parser.add_argument("--memory-format", choices=("nchw", "nhwc"), default="nchw",
                        help="nhwc: channels-last model and inputs on both sides (default: nchw)")
    parser.add_argument("--label-smoothing", type=float, default=0.0, metavar="S",
                        help="label smoothing of the loss on both sides (default: 0)")
    parser.add_argument("-o", "--output", metavar="FILE", default=None, help="JSON file to write")
    return parser


def make_engine(args: argparse.Namespace, runtime: Runtime, model: nn.Module) -> Engine:
    config = RunConfig(arch=args.arch, num_classes=args.num_classes, model_options=(),
                       preprocessing=Preprocessing(args.image_size), lr=LR, momentum=MOMENTUM,
                       weight_decay=WEIGHT_DECAY, batch_size=args.batch_size, label_smoothing=args.label_smoothing,
                       print_freq=10**9)
    engine = Engine(config, runtime, model, log=lambda *_: None)
    engine.set_epoch_lr(0)
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


def measure(args: argparse.Namespace) -> dict:
    runtime = make_runtime(args.device, amp=args.amp, amp_dtype=args.amp_dtype, memory_format=args.memory_format,
                           log=lambda *_: None)
    torch.manual_seed(0)
    model = build_model(args.arch, num_classes=args.num_classes)
    plain_model = copy.deepcopy(model)
    ours_model = model.to(runtime.device, memory_format=runtime.memory_format).train()
    plain_model = plain_model.to(runtime.device, memory_format=runtime.memory_format).train()
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=generator)
    images = images.to(runtime.device).contiguous(memory_format=runtime.memory_format)
    targets = torch.randint(0, args.num_classes, (args.batch_size,), generator=generator).to(runtime.device)
    sides = {"ours": ours_step(make_engine(args, runtime, ours_model), images, targets),
             "plain": plain_step(args, runtime, plain_model, images, targets)}

    warmup = {name: timed(*side, args.warmup, runtime) if args.warmup > 0 else 0.0 for name, side in sides.items()}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for _ in range(args.repeats):
        for name in order:
            seconds = timed(*sides[name], args.iters, runtime)
            rates[name].append(args.iters * args.batch_size / seconds)
        order.reverse()  # neither side always runs first

    ours, plain = summarise(rates["ours"]), summarise(rates["plain"])
    precision = "fp32" if runtime.amp_dtype is None else str(runtime.amp_dtype).replace("torch.", "")
    return {
        "benchmark": "train_throughput",
        "command": command_line(),
        "config": {"arch": args.arch, "image_size": args.image_size, "batch_size": args.batch_size,
                   "num_classes": args.num_classes, "iters": args.iters, "warmup": args.warmup,
                   "repeats": args.repeats, "precision": precision, "memory_format": args.memory_format,
                   "label_smoothing": args.label_smoothing},
        "environment": environment(runtime.device),
        "unit": "images/s",
        "warmup_seconds": warmup,
        "ours": ours,
        "plain": plain,
        "ratio": ours["median"] / plain["median"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = measure(args)
    config, ours, plain = result["config"], result["ours"], result["plain"]
    print(f"{config['arch']} {config['image_size']} px, batch {config['batch_size']}, {config['precision']}, "
          f"{config['memory_format']} on {result['environment']['device_name']} "
          f"(torch {result['environment']['torch']})")
    for name, stats in (("ours", ours), ("plain", plain)):
        print(f"  {name:>5}: {stats['median']:8.1f} img/s median of {len(stats['values'])} "
              f"(spread {100 * stats['relative_spread']:.1f}%), warm-up {result['warmup_seconds'][name]:.2f} s")
    print(f"  ratio ours / plain: {result['ratio']:.3f}")
    write_json(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))

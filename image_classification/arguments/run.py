"""The ``run, checkpoints and logging`` group: what the run does (train, evaluate, profile), where it keeps its
checkpoints and where it writes its raport.

A flag added to this group is a field of :class:`RunSettings` (declared with :func:`.values.flag`), whose order is
the order of ``-h`` and of docs/options.md (``python scripts/readme_options.py`` rewrites that list); a check of its
value alone goes into :func:`check_run_values`, of its combination with other flags into
:func:`check_run_combinations`.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from ..errors import UserError
from ..system.cli import positive_int, whole, whole_number
from .values import MAX_WAIT_S, add_group, flag, raise_first, shown

DEFAULT_RAPORT_FILE = "experiment_raport.json"


@dataclass(frozen=True)
class RunSettings:
    """The ``run, checkpoints and logging`` group: what the run does (train, evaluate, profile), where it keeps its
    checkpoints and where it writes its raport; ``seed`` and ``topk`` as the run settles them, and the run's
    identity (``run_id``, kept across resumes; ``resumed_from``, the checkpoint it continues)."""

    seed: int | None = flag("--seed", metavar="SEED", type=whole, help="random seed; every RNG is seeded "
                            "from it and the global rank (default: a random one, recorded in checkpoints)")
    print_freq: int = flag("--print-freq", "-p", default=10, metavar="N", type=positive_int,
                           help="print frequency (default: 10)")
    prof: int = flag("--prof", default=-1, metavar="N", type=whole_number,
                     help="Run only N iterations of training and of validation per epoch (default: -1, "
                     "all)")
    benchmark_warmup: int = flag("--benchmark-warmup", default=0, metavar="N", type=whole_number,
                                 help="leave the first N iterations of training and of each validation out "
                                 "of the throughput and latency of epochs and of the summary (cuDNN's "
                                 "autotuning, the allocator's growth); *.wall_ips keeps every iteration "
                                 "(default: 0; 20 in launch.py's benchmark modes)")
    evaluate: bool = flag("--evaluate", action="store_true", help="evaluate checkpoint/model")
    training_only: bool = flag("--training-only", action="store_true", help="do not evaluate")
    topk: int | None = flag("--topk", metavar="K", type=positive_int, help="the second accuracy reported, "
                            "top-K, at most the class count (default: 5, or the class count when smaller)")
    resume: str | None = flag("--resume", metavar="PATH", help="path to latest checkpoint; 'auto': the "
                              "valid checkpoint in --workspace that got furthest (epoch, then batch), or a "
                              "fresh start (from --pretrained-weights where given) when there is none "
                              "(default: none)")
    allow_class_changes: bool = flag("--allow-class-changes", action="store_true",
                                     help="go on when the class folders give labels other than those of "
                                     "the checkpoint resumed or evaluated (a class renamed, removed or "
                                     "added before others): each label then stands for the class the "
                                     "folders give it now (default: refuse, naming the classes that moved)")
    workspace: str = flag("--workspace", default="./", metavar="DIR", help="where checkpoints and raports "
                          "go (default: ./; --evaluate --resume F: F's folder)")
    checkpoint_filename: str = flag("--checkpoint-filename", "--checkpoint", default="checkpoint.pth.tar",
                                    metavar="NAME", help="name of the latest checkpoint in the workspace "
                                    "(default: checkpoint.pth.tar)")
    overwrite: bool = flag("--overwrite", action="store_true", help="let a new run (no --resume) replace "
                           "the run whose checkpoints or --raport-file the workspace holds (default: "
                           "refuse, naming --resume auto, --raport-file and --workspace)")
    save_checkpoints: bool = flag("--no-checkpoints", action="store_false",
                                  help="do not store any checkpoints, useful for benchmarking")
    checkpoint_interval: str | None = flag("--checkpoint-interval", metavar="N|Nm",
                                           help="also write the latest checkpoint in the middle of an "
                                           "epoch, every N iterations or every N minutes (Nm); a killed "
                                           "run loses at most that much (default: at epoch ends only)")
    gather_checkpoints: int = flag("--gather-checkpoints", default=0, metavar="N", type=whole_number,
                                   nargs="?", const=-1, help="also keep per-epoch checkpoints: alone, all "
                                   "of them; with N, the last N (default: only the latest and the best are "
                                   "kept)")
    raport_file: str | None = flag("--raport-file", metavar="FILE", help="file in which to store JSON "
                                   "experiment raport, inside the workspace (default: "
                                   "experiment_raport.json)")
    tensorboard: str | None = flag("--tensorboard", metavar="DIR", help="also write the raport's metrics "
                                   "as TensorBoard event files into DIR (default: off)")

    run_id: str = ""
    resumed_from: str | None = None

    @property
    def saves(self) -> bool:
        """Whether the run writes checkpoints: a training run that was not told not to (an evaluation never does)."""
        return self.save_checkpoints and not self.evaluate

    @property
    def interval(self) -> "CheckpointInterval | None":
        """``--checkpoint-interval`` read (checked when parsed)."""
        return CheckpointInterval.parse(self.checkpoint_interval) if self.checkpoint_interval else None

    @property
    def raport_name(self) -> str:
        """The raport's name: ``--raport-file``'s, else the default (see :func:`raport_file`)."""
        return DEFAULT_RAPORT_FILE if self.raport_file is None else self.raport_file


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``run, checkpoints and logging`` group."""
    add_group(parser, "run, checkpoints and logging", RunSettings)


def check_run_values(args: argparse.Namespace) -> None:
    """The run flags' ranges that argparse's types do not cover. Raises :class:`UserError`."""
    raise_first((
        (args.seed is not None and not 0 <= args.seed < 2**63,
         f"--seed must be 0 to 2**63 - 1 (checkpoints record it, and a resume refuses any other), got {args.seed}"),
        (args.benchmark_warmup < 0, f"--benchmark-warmup must be 0 or more, got {args.benchmark_warmup}"),
        (args.gather_checkpoints < -1,
         f"--gather-checkpoints must be -1 (all), 0 (none) or a count, got {args.gather_checkpoints}"),
    ))
    if args.checkpoint_interval is not None:
        try:
            CheckpointInterval.parse(args.checkpoint_interval)
        except ValueError as error:
            raise UserError(f"--checkpoint-interval {error}") from None


def check_run_combinations(args: argparse.Namespace) -> None:
    """Run flags that exclude each other, or another group's. Raises :class:`UserError`."""
    if args.evaluate and args.training_only:
        raise UserError("--evaluate and --training-only exclude each other")
    if args.training_only and args.early_stopping_patience > 0:
        raise UserError("--early-stopping-patience counts validated epochs without a better top1, and --training-only "
                        "validates none: give one of them")
    if args.resume and args.resume != "auto" and args.pretrained_weights:
        raise UserError(f"--resume {args.resume} and --pretrained-weights exclude each other: a checkpoint already holds "
                        "weights (--resume auto takes the workspace's checkpoint where there is one, else the weights)")


def bare_gather_flag(argv: list[str]) -> list[str]:
    """``--gather-checkpoints`` followed by a non-number (say DIR) means keep all: don't eat DIR."""
    out = []
    for index, token in enumerate(argv):
        following = argv[index + 1] if index + 1 < len(argv) else None
        if token == "--gather-checkpoints" and (following is None or not following.lstrip("-").isdigit()):
            token = "--gather-checkpoints=-1"
        out.append(token)
    return out


def raport_file(args: argparse.Namespace) -> str:
    """The raport's name: ``--raport-file`` as given, else the default.  The flag's default is None, so that a
    name the user typed, the default's included, can be told from none (an evaluation refuses a typed name
    that exists, and picks a new one beside the default)."""
    return DEFAULT_RAPORT_FILE if args.raport_file is None else args.raport_file


@dataclass(frozen=True)
class CheckpointInterval:
    """``--checkpoint-interval``: every ``iterations`` train iterations, or every ``seconds`` of wall time."""

    iterations: int | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str) -> "CheckpointInterval":
        match = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?\s*([smh]?)\s*", str(text))
        if not match:
            raise ValueError(f"expected N (iterations) or Nm / Ns / Nh (minutes, seconds, hours), got {shown(text)}")
        whole, fraction, unit = match.group(1), match.group(2) or "", match.group(3)
        if not int(whole) and not fraction.strip("0"):
            raise ValueError(f"must be positive, got {shown(text)}")
        if not unit:
            if fraction.strip("0"):
                raise ValueError(f"a number of iterations is a whole number, got {shown(text)}")
            return cls(iterations=int(whole))  # read as an integer: a float would round a long count
        seconds = float(f"{whole}.{fraction or 0}") * {"s": 1, "m": 60, "h": 3600}[unit]
        if seconds > MAX_WAIT_S:
            raise ValueError(f"is a time of at most a year ({MAX_WAIT_S // 3600:,}h), got {shown(text)}")
        return cls(seconds=seconds)

    def __str__(self) -> str:
        if self.iterations is not None:
            return f"every {self.iterations} iterations"
        return f"every {self.seconds / 60:g} minutes"

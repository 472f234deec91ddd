"""``launch.py``: run main.py with a preset from ``configs.yml`` as its defaults.

A preset is picked by model, platform, precision and mode (and optionally a recipe), and stacked as
``{**REFERENCE_DEFAULTS, **precision[P], **platform[H], **models[M][H][P], **recipes[R], **mode[X]}`` (later
layers win).  The result becomes the defaults of main.py's parser, which parses the command line once, so every
flag typed still wins and every preset value goes through the checks of the flag it stands for.
``REFERENCE_DEFAULTS`` are the reference main.py's values where a plain run's differ: a preset resolves to the run
it was in the reference.  What this machine makes of the run (CUDA or the CPU, the autocast dtype, the memory
layout) is the runtime's decision (:mod:`.system.host`), which ``--dry-run`` states; a learning rate stated for
a global batch (``lr_batch``) is scaled by main.py itself (``--lr-batch``).

``configs.yml`` is the user's own file: it is read with PyYAML's safe loader, bounded in size, and anything that
is not a mapping of known sections and main.py flags is one line naming it.  Like main.py's parser, this module
imports no torch until a run starts: ``-h``, ``--list`` and a mistyped flag answer at once.  The presets file is
package data (``image_classification/configs.yml``, a link to the repository's ``configs.yml``), so an installed
package finds its presets too.
"""

from __future__ import annotations

import argparse
import copy
import functools
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import yaml

from .arguments import REFERENCE_DEFAULTS, build_parser as build_main_parser, global_batch, parse_args, resolve_lr
from .arguments.described import main_py_argv, source_of, typed_dests, value_sources
from .errors import UserError
from .records.datafile import DataFileError, read_regular, utf8_text
from .system import host, machine
from .system.cli import UserErrorParser

# In a source tree the link resolves to the repository's configs.yml, the file users edit.
DEFAULT_CFG_FILE = (Path(__file__).parent / "configs.yml").resolve()
DIR_PLACEHOLDER = "DIR"  # stands for the dataset folder in a --dry-run command given none
SECTIONS = ("precision", "platform", "mode", "models")
MAX_CFG_BYTES = 1 << 20  # far above a presets file (configs.yml: about 20 KB); /dev/zero is no presets file
IMAGENET_CLASSES = 1000


# ------------------------------------------------------------------------------------------------
# Presets
# ------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _parsed(text: str) -> object:
    """``text`` through the safe loader, once per text: the pure-Python loader takes about 0.2 s over configs.yml,
    and a dry run or a test resolves many presets.  Shared: never changed by its callers (errors are not cached)."""
    return yaml.safe_load(text)


def _config(cfg_file: str | Path) -> dict:
    """The presets file, checked: a mapping that holds the sections :data:`SECTIONS`, each a mapping; else one
    line.  Shared between calls (see :func:`_parsed`): read from, never changed."""
    try:
        config = _parsed(utf8_text(read_regular(cfg_file, MAX_CFG_BYTES, follow_links=True)))
    except DataFileError as error:
        raise UserError(f"{cfg_file} {error}: it is not a presets file") from None
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise UserError(f"{cfg_file} is not valid YAML{line}: {getattr(error, 'problem', error)}") from None
    except RecursionError:  # the pure-Python loader's composer recurses once per level of nesting
        raise UserError(f"{cfg_file} nests its values too deeply: it is not a presets file") from None
    if not isinstance(config, dict):
        raise UserError(f"{cfg_file} must hold a mapping with the sections {', '.join(SECTIONS)}")
    missing = [section for section in SECTIONS if not isinstance(config.get(section), dict)]
    if missing:
        raise UserError(f"{cfg_file} lacks the section(s) {', '.join(missing)}")
    return config


def load_config(cfg_file: str | Path = DEFAULT_CFG_FILE) -> dict:
    """The presets file: a mapping that holds the sections :data:`SECTIONS`, each a mapping; else one line.
    The caller's own copy."""
    return copy.deepcopy(_config(cfg_file))


def _choose(table: dict, name: str, what: str) -> dict:
    """``table[name]``, a mapping of main.py flags (the shared file's: read, never changed); else one line."""
    if name not in table:
        raise UserError(f"unknown {what} {name!r}; choose one of: {', '.join(map(str, table))}")
    entry = table[name]
    if entry is not None and not isinstance(entry, dict):
        raise UserError(f"{what} {name!r} is not a mapping of main.py flags")
    return entry or {}


def resolve_layers(model: str, precision: str, mode: str, platform: str,
                   cfg_file: str | Path = DEFAULT_CFG_FILE, recipe: str | None = None) -> list[tuple[str, dict]]:
    """The presets one model x platform x precision x mode (and recipe) stacks, each with where it is in the
    file, in the order they apply (a later one's values win): the caller's own copies."""
    config = _config(cfg_file)
    recipe_preset = {}
    if recipe is not None:
        recipes = config.get("recipes")
        if not isinstance(recipes, dict) or not recipes:
            raise UserError(f"{cfg_file} has no recipes section, so --recipe {recipe} cannot be found")
        recipe_preset = _choose(recipes, recipe, "recipe")
    platforms = _choose(config["models"], model, "model")
    layers = [("the reference main.py's defaults", REFERENCE_DEFAULTS),
              (f"precision.{precision}", _choose(config["precision"], precision, "precision")),
              (f"platform.{platform}", _choose(config["platform"], platform, "platform"))]
    mode_preset = _choose(config["mode"], mode, "mode")
    if platform not in platforms:
        raise UserError(f"{model} has no presets for platform {platform}; its platforms: {', '.join(platforms)}")
    precisions = platforms[platform] or {}
    if precision not in precisions:
        raise UserError(f"{model} on {platform} has no {precision} preset; choose one of: {', '.join(precisions)}")
    layers.append((f"models.{model}.{platform}.{precision}", _choose(precisions, precision, "preset")))
    if recipe is not None:
        layers.append((f"recipes.{recipe}", recipe_preset))
    return copy.deepcopy(layers + [(f"mode.{mode}", mode_preset)])


def merged(layers: list[tuple[str, dict]]) -> dict:
    return {key: value for _, preset in layers for key, value in preset.items()}


def fit_recipe_to_mode(preset: dict, layers: list[tuple[str, dict]]) -> tuple[dict, dict, list[str]]:
    """``preset`` fitted to a mode that runs fewer epochs than its recipe's schedule (the benchmark and evaluate
    modes run 1 to 3), the values it changed, and a sentence per change: the epochs run train at the crop that the
    recipe's progressive resizing starts with (``train_crop_size``, its MIN; the schedule's START and END lie past
    them), and the triangular rate peaks at the run's last epoch at the latest.  Anything else is unchanged."""
    epochs, source = preset.get("epochs"), source_of("epochs", layers)
    if epochs is None or not source or not source.startswith("mode."):
        return preset, {}, []
    changed, notes = {}, []
    resize = preset.get("progressive_resize")
    if isinstance(resize, list) and len(resize) == 4 and isinstance(resize[3], int) and resize[3] >= epochs:
        changed.update(progressive_resize=None, train_crop_size=resize[0])
        notes.append(f"{source} runs {epochs} epoch(s), before progressive_resize {resize} "
                     f"({source_of('progressive_resize', layers)}) would grow the crop: they train at its "
                     f"{resize[0]} px (train_crop_size)")
    peak = preset.get("lr_peak_epoch")
    if preset.get("lr_schedule") == "triangular" and isinstance(peak, int) and peak >= epochs:
        changed["lr_peak_epoch"] = epochs - 1
        notes.append(f"{source} runs {epochs} epoch(s): the triangular rate peaks at the start of epoch {epochs} "
                     f"(lr_peak_epoch {epochs - 1} for {peak})")
    fitted = {key: value for key, value in {**preset, **changed}.items() if key not in changed or value is not None}
    return fitted, changed, notes


@dataclass
class Preset:
    """A preset as main.py's defaults, and where its values come from: the layers it stacks (the changes that fit
    a recipe to a short mode last), and a sentence per such change."""

    values: dict
    layers: list[tuple[str, dict]]
    fitted: list[str] = field(default_factory=list)


def preset_for(launch: argparse.Namespace, typed: set[str]) -> Preset:
    """The preset launch.py's flags pick, as main.py's defaults.  Three values give way to the command line:
    the presets' ImageNet class count (main.py then takes the checkpoint's or the dataset's, as for a run
    without a preset) unless a count is typed; ``lr_batch``, which states the global batch of the preset's
    own ``lr`` and so goes with it where ``--lr`` is typed (without ``--lr-batch``); and ``val_resize_size``,
    the resize of the preset's own crop, where another crop is typed (``--image-size`` or ``--val-crop-size``,
    without ``--val-resize-size``): main.py then resizes to that crop / 0.875."""
    layers = resolve_layers(launch.model, launch.precision, launch.mode, launch.platform, launch.cfg_file,
                            recipe=launch.recipe)
    values, changed, fitted = fit_recipe_to_mode(merged(layers), layers)
    if changed:
        recipe = source_of("progressive_resize", layers) or source_of("lr_peak_epoch", layers)
        layers = [*layers, (f"{recipe} fitted to {source_of('epochs', layers)}", changed)]
    if values.get("num_classes") == IMAGENET_CLASSES and "num_classes" not in typed:
        del values["num_classes"]
    if "lr" in typed and "lr_batch" not in typed:
        values.pop("lr_batch", None)
    if typed & {"image_size", "val_crop_size"} and "val_resize_size" not in typed:
        values.pop("val_resize_size", None)
    return Preset(values, layers, fitted)


def resolve(model: str, precision: str, mode: str, platform: str, cfg_file: str | Path = DEFAULT_CFG_FILE,
            recipe: str | None = None) -> dict:
    """The preset for one model x platform x precision x mode (and recipe), fitted to its mode: main.py dests."""
    layers = resolve_layers(model, precision, mode, platform, cfg_file, recipe)
    return fit_recipe_to_mode(merged(layers), layers)[0]


def list_presets(cfg_file: str | Path = DEFAULT_CFG_FILE) -> str:
    """A readable table of what ``cfg_file`` offers."""
    config = _config(cfg_file)
    lines = [f"presets in {cfg_file}:", f"  modes: {', '.join(config['mode'])}"]
    if isinstance(config.get("recipes"), dict):
        lines.append(f"  recipes (--recipe): {', '.join(config['recipes'])}")
    for model, platforms in config["models"].items():
        lines.append(f"  {model}:")
        for platform, precisions in (platforms or {}).items():
            lines.append(f"    {platform}: {', '.join(precisions or {})}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# --dry-run: the run as a main.py command line, what this machine makes of it, and where each value comes from
# ------------------------------------------------------------------------------------------------
def host_lines(args: argparse.Namespace) -> list[str]:
    """What this machine makes of the run, as its runtime will (:func:`.system.host.choose`), and its learning rate
    (:func:`.arguments.resolve_lr`, for this job's processes)."""
    from .models.archs import cpu_trains_faster_channels_last  # deferred: the architectures, for a dry run

    choice = host.choose(args.device, args.amp, args.amp_dtype, args.memory_format,
                         cpu_channels_last=cpu_trains_faster_channels_last(args.arch))
    precision = f"{choice.amp_dtype} autocast" if choice.amp_dtype else "full precision"
    lines = [f"# on this machine: {'CUDA' if choice.cuda else 'the CPU'}, {precision}, memory format "
             f"{choice.memory_format}", *(f"#   {note}" for note in choice.notes)]
    if args.gpu_affinity != "none" and not choice.cuda:
        lines.append(f"#   --gpu-affinity {args.gpu_affinity} pins processes to a GPU's cores; there is no GPU: "
                     "ignored")
    batch = global_batch(args.batch_size, machine.distributed_env()[2], args.optimizer_batch_size)
    note = resolve_lr(args.lr, args.lr_batch, batch, optimizer=args.optimizer, warmup=args.warmup)[1]
    if args.augmentation is not None and not args.evaluate:
        from .data import augmentation_notice, resolve_backend  # deferred: DALI's presence, for a dry run

        augmentation = augmentation_notice(resolve_backend(args.data_backend, choice.cuda), args.augmentation)
        lines.append(f"#   {augmentation.removeprefix('=> ')}")
    return lines + ([f"#   {note.removeprefix('=> ')}"] if note else [])


def dry_run_report(title: str, args: argparse.Namespace, preset: Preset, typed: set[str],
                   trainer: Sequence[str] = ("python", "main.py")) -> str:
    """``--dry-run``'s text: the preset's main.py command as written (the same on any machine), what this machine
    makes of it, the class count the run will use (the dataset's, when the command names one), and every value of
    the run with where it comes from."""
    from .train.startup import class_count_note  # deferred: numpy and PIL (a dataset's count), for a dry run

    placeholder = [DIR_PLACEHOLDER] if args.data is None and args.data_backend != "synthetic" else []
    where_dir = f" ({DIR_PLACEHOLDER}: the dataset folder)" if placeholder else ""
    lines = [*(f"# {note}" for note in preset.fitted), f"# {title}, as written{where_dir}:",
             shlex.join([*trainer, *main_py_argv(args, preset.values), *placeholder]), *host_lines(args),
             class_count_note(args, DIR_PLACEHOLDER if placeholder else None)]
    return "\n".join(lines + value_sources(args, typed, preset.layers))


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
def build_parser(prog: str = "launch.py") -> argparse.ArgumentParser:
    parser = UserErrorParser(
        prog=prog,
        allow_abbrev=False,  # an abbreviated main.py flag must not be taken for one of ours
        usage=f"{prog} --model M --precision P --mode X --platform H [--recipe R] [--cfg_file FILE] "
        "[--dry-run] [main.py flags] [DIR]",
        description="Run main.py with a preset from configs.yml (see --list).",
        epilog="Every other argument goes to main.py (python main.py -h lists them) and overrides the "
        "preset. DIR may be left out with --dry-run, or with --mode benchmark_training_short (synthetic "
        "data).",
    )
    parser.add_argument("--cfg_file", "--cfg-file", metavar="FILE", default=str(DEFAULT_CFG_FILE),
                        help="presets file (default: the configs.yml that comes with the package)")
    parser.add_argument("--model", metavar="M", help="model preset, e.g. resnet50")
    parser.add_argument("--precision", metavar="P", help="precision preset: AMP, BF16, TF32 or FP32")
    parser.add_argument("--mode", metavar="X",
                        help="benchmark_training, benchmark_training_short, benchmark_inference, "
                        "convergence or evaluate")
    parser.add_argument("--platform", metavar="H", help="platform preset, e.g. DGXA100, DGXH100 or CPU")
    parser.add_argument("--recipe", metavar="R", default=None,
                        help="a training recipe of the presets file's recipes section, e.g. "
                        "torchvision-v2 (torchvision's ResNet-50 IMAGENET1K_V2 hyperparameters); it replaces "
                        "the model's own (default: the model's, NVIDIA's)")
    parser.add_argument("--dry-run", "--print-config", dest="dry_run", action="store_true",
                        help="print the main.py command line the preset stands for, what this machine makes of "
                        "it and where every value comes from; DIR may be left out; then exit")
    parser.add_argument("--list", action="store_true", help="list the presets of the config file and exit")
    return parser


def preset_run(argv: Sequence[str] | None, prog: str, *, require_data: bool = True
               ) -> tuple[argparse.Namespace, argparse.Namespace | None, Preset | None, set[str]]:
    """(launch.py's own flags, main.py's arguments with the preset as their defaults, the preset, the dests typed);
    no preset nor arguments for ``--list``."""
    parser = build_parser(prog)
    launch, rest = parser.parse_known_args(argv)
    if launch.list:
        return launch, None, None, set()
    main_parser = build_main_parser(prog)
    main_parser.refuse_unknown_flags(rest, parser)  # a typo of either's flag, before "missing --model"
    rest = main_parser.expand_prefixes(rest)  # said once here; the parses below read the whole flags
    missing = [f"--{name}" for name in ("model", "precision", "mode", "platform") if getattr(launch, name) is None]
    if missing:
        raise UserError(f"launch.py: the following arguments are required: {', '.join(missing)}")
    typed = typed_dests(rest)
    preset = preset_for(launch, typed)
    args = parse_args(rest, defaults=preset.values, require_data=require_data and not launch.dry_run, prog=prog)
    return launch, args, preset, typed


def run_arguments(argv: Sequence[str], prog: str = "launch.py") -> argparse.Namespace | None:
    """main.py's arguments for the run that a launch.py command line starts; None for ``--list`` and ``--dry-run``,
    which start none (multiproc.py starts one process per GPU with them)."""
    launch, args, _, _ = preset_run(argv, prog)
    return None if args is None or launch.dry_run else args


def main(argv: Sequence[str] | None = None, *, prog: str = "launch.py") -> int:
    """Resolve the preset and train (or describe the run, with --dry-run).

    ``prog``: the command's name; installed as ``ic-launch``, the commands it prints name ``ic-train``.
    """
    launch, args, preset, typed = preset_run(argv, prog)
    if args is None:
        print(list_presets(launch.cfg_file))
        return 0
    if launch.dry_run:
        recipe = f" --recipe {launch.recipe}" if launch.recipe else ""
        title = f"{launch.model} {launch.precision} {launch.mode} {launch.platform}{recipe} from {launch.cfg_file}"
        trainer = ("python", "main.py") if prog == "launch.py" else ("ic-train",)
        print(dry_run_report(title, args, preset, typed, trainer))
        return 0
    for note in preset.fitted:
        print(f"{prog}: {note}", flush=True)
    from .train.startup import launched, preflight  # deferred: numpy and PIL (the dataset check), past -h

    classes = None if launched() else preflight(args)  # before torch's import (seconds); a launched rank: in the run
    from .training import train  # deferred: torch

    return train(args, classes=classes)

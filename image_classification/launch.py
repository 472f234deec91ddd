"""``launch.py``: run main.py with a preset from ``configs.yml``.

A preset is picked by model, platform, precision and mode (and optionally a recipe), and resolved as
``{**REFERENCE_DEFAULTS, **precision[P], **platform[H], **models[M][H][P], **recipes[R], **mode[X]}`` (later
entries win).  The result becomes the defaults of main.py's parser, so every flag given on the command line
still wins.  ``REFERENCE_DEFAULTS`` are the reference main.py's defaults where a plain run's differ (the
learning rate, the last BatchNorm's initialisation): a preset resolves to the run it was in the reference.

Like main.py's parser, this module imports no torch until a run starts: ``-h``, ``--list`` and a mistyped
flag answer at once.

The presets file is package data (``image_classification/configs.yml``, a link to the repository's
``configs.yml``, the one copy there is), so an installed package finds its presets too.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Sequence

import yaml

from .arguments import REFERENCE_DEFAULTS, build_parser as build_main_parser, flag_tokens, parse_args
from .cli import UserErrorParser
from .datafile import DataFileError, read_regular, utf8_text
from .errors import UserError

# In a source tree the link resolves to the repository's configs.yml, the file users edit.
DEFAULT_CFG_FILE = (Path(__file__).parent / "configs.yml").resolve()
DIR_PLACEHOLDER = "DIR"  # stands for the dataset folder in a --dry-run command given none
SECTIONS = ("precision", "platform", "mode", "models")
# Larger than a presets file by far (configs.yml: about 8 KB), smaller than what would take long to read or
# parse; a larger file, or one that is no regular file (/dev/zero, a FIFO), is refused before it is read.
MAX_CFG_BYTES = 1 << 20
# More values than a presets file holds by far (configs.yml: about 2,000 once its aliases are written out),
# far fewer than a YAML alias bomb (a few lines that expand to billions, or a value that holds itself).
MAX_VALUES = 100_000
# libyaml's parser when PyYAML was built with it (several times faster), the pure-Python one otherwise;
# both are the safe loader: plain values only, no tags that build Python objects.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# Far deeper than a presets file nests (configs.yml: 6, models > model > platform > precision > key > list),
# far shallower than the depth at which the loaders' recursive composers run out of stack: the C one dies
# with a segfault there, which no exception handler can turn into a message.
MAX_NESTING = 32


# ------------------------------------------------------------------------------------------------
# Presets
# ------------------------------------------------------------------------------------------------
def load_config(cfg_file: str | Path = DEFAULT_CFG_FILE) -> dict:
    """Read and sanity-check a presets file; raises :class:`UserError` for a bad file."""
    try:
        # a regular file (not /dev/zero, not a FIFO that would wait for a writer) of at most MAX_CFG_BYTES; a link
        # is followed (the package's configs.yml is one)
        text = utf8_text(read_regular(cfg_file, MAX_CFG_BYTES, follow_links=True))
        _check_nesting(text, cfg_file)
        config = yaml.load(text, Loader=YAML_LOADER)
    except DataFileError as error:
        raise UserError(f"{cfg_file} {error}: it is not a presets file") from None
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise UserError(f"{cfg_file} is not valid YAML{line}: {getattr(error, 'problem', error)}") from None
    if _expanded_size(config, MAX_VALUES) > MAX_VALUES:
        raise UserError(f"{cfg_file} expands to more than {MAX_VALUES:,} values (its aliases repeat what they "
                        "name, or a value holds itself): it is not a presets file")
    if not isinstance(config, dict):
        raise UserError(f"{cfg_file} must hold a mapping with the sections {', '.join(SECTIONS)}")
    _refuse_nul_bytes(config, cfg_file)
    missing = [section for section in SECTIONS if not isinstance(config.get(section), dict)]
    if missing:
        raise UserError(f"{cfg_file} lacks the section(s) {', '.join(missing)}")
    return config


def _check_nesting(text: str, cfg_file: str | Path) -> None:
    """Refuse ``text`` if its collections nest more than :data:`MAX_NESTING` deep, found from the parser's
    events (the parser keeps its own stack; only the composer that builds the values recurses), before
    anything is composed, and no further into the text than that depth."""
    depth = 0
    for event in yaml.parse(text, Loader=YAML_LOADER):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_NESTING:
                raise UserError(f"{cfg_file} nests its values more than {MAX_NESTING} levels deep (line "
                                f"{event.start_mark.line + 1}): it is not a presets file")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _refuse_nul_bytes(config: dict, cfg_file: str | Path) -> None:
    """A NUL byte in a key or a string value is no flag value or file name (the OS refuses it in a path):
    one message naming where it is.  ``config`` has passed the size check, so the walk is short; each place
    is a (parent, key) link, as aliases may nest the values far deeper than the text does."""
    pending: list[tuple[tuple | None, object]] = [(None, config)]
    while pending:
        where, item = pending.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if isinstance(key, str) and "\0" in key:
                    raise UserError(f"{cfg_file}: the key {_path((where, key))} holds a NUL byte, {NUL_REASON}")
                pending.append(((where, key), value))
        elif isinstance(item, list):
            pending += [((where, [index]), value) for index, value in enumerate(item)]  # [i]: a position
        elif isinstance(item, str) and "\0" in item:
            raise UserError(f"{cfg_file}: the value of {_path(where)} holds a NUL byte, {NUL_REASON}")


NUL_REASON = "which no flag value or file name can hold"


def _path(where: tuple | None) -> str:
    """A place as ``models.resnet50.CPU.FP32.crop_scale[0]``: keys escaped where they are not printable
    (a NUL byte as \\x00), the whole cut short."""
    parts = []
    while where is not None:
        where, part = where
        parts.append(part)
    text = ""
    for part in reversed(parts):
        if isinstance(part, list):
            text += f"[{part[0]}]"
        else:
            name = str(part)[:100]
            text += ("." if text else "") + (name if name.isprintable() else ascii(name))
        if len(text) > 200:
            return text[:197] + "..."
    return text


def _expanded_size(value, budget: int) -> int:
    """How many values ``value`` holds with its shared parts counted each time they appear, as a message
    or a walk would see them: counted no further than just past ``budget``, so a bomb costs no more."""
    count, pending = 0, [value]
    while pending and count <= budget:
        item = pending.pop()
        count += 1
        if isinstance(item, dict):
            pending += [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple)):
            pending += item
    return count


def _choose(table: dict, name: str, what: str) -> dict:
    if name not in table:
        raise UserError(f"unknown {what} {name!r}; choose one of: {', '.join(table)}")
    entry = table[name]
    return {} if entry is None else entry


def resolve(model: str, precision: str, mode: str, platform: str,
            cfg_file: str | Path = DEFAULT_CFG_FILE, recipe: str | None = None) -> dict:
    """The preset for one model x platform x precision x mode: a dict of main.py argparse dests, over the
    reference main.py's defaults where a plain run's differ (``REFERENCE_DEFAULTS``).

    ``recipe`` names an entry of the file's ``recipes`` section, whose hyperparameters replace the
    model's own (NVIDIA's) for every platform and precision."""
    config = load_config(cfg_file)
    recipe_preset = {}
    if recipe is not None:
        recipes = config.get("recipes")
        if not isinstance(recipes, dict) or not recipes:
            raise UserError(f"{cfg_file} has no recipes section, so --recipe {recipe} cannot be found")
        recipe_preset = _choose(recipes, recipe, "recipe")
    platforms = _choose(config["models"], model, "model")
    precision_preset = _choose(config["precision"], precision, "precision")
    platform_preset = _choose(config["platform"], platform, "platform")
    mode_preset = _choose(config["mode"], mode, "mode")
    if platform not in platforms:
        raise UserError(f"{model} has no presets for platform {platform}; "
                        f"its platforms: {', '.join(platforms)}")
    precisions = platforms[platform] or {}
    if precision not in precisions:
        raise UserError(f"{model} on {platform} has no {precision} preset; "
                        f"choose one of: {', '.join(precisions)}")
    return {**REFERENCE_DEFAULTS, **precision_preset, **platform_preset, **(precisions[precision] or {}),
            **recipe_preset, **mode_preset}


def adapt_to_host(preset: dict, device: str, cuda_available: bool) -> tuple[dict, list[str]]:
    """Make a GPU preset runnable on a machine without CUDA; return it and one notice per change.

    ``device`` is the device the run asks for after the command line is applied ("auto", "cpu",
    "cuda").  An explicit ``--device cuda`` without CUDA is left for main.py to reject.
    """
    on_cpu = device == "cpu" or (device == "auto" and not cuda_available)
    if not on_cpu:
        return dict(preset), []
    adapted, notices = dict(preset), []
    if device == "auto":
        adapted["device"] = "cpu"
        notices.append("no CUDA device found: the run uses the CPU")
    if adapted.get("amp") and adapted.get("amp_dtype") != "bfloat16":
        adapted["amp_dtype"] = "bfloat16"
        notices.append("AMP on the CPU: bf16 autocast instead of fp16, without loss scaling")
    if adapted.get("gpu_affinity", "none") != "none":
        notices.append(f"gpu_affinity {adapted['gpu_affinity']} pins processes to GPUs' cores: "
                       "left at none on the CPU")
        adapted["gpu_affinity"] = "none"
    return adapted, notices


def list_presets(cfg_file: str | Path = DEFAULT_CFG_FILE) -> str:
    """A readable table of what ``cfg_file`` offers."""
    config = load_config(cfg_file)
    lines = [f"presets in {cfg_file}:", f"  modes: {', '.join(config['mode'])}"]
    if isinstance(config.get("recipes"), dict):
        lines.append(f"  recipes (--recipe): {', '.join(config['recipes'])}")
    for model, platforms in config["models"].items():
        lines.append(f"  {model}:")
        for platform, precisions in (platforms or {}).items():
            lines.append(f"    {platform}: {', '.join(precisions or {})}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# The resolved run as a main.py command line
# ------------------------------------------------------------------------------------------------
def main_py_argv(args: argparse.Namespace, always: Sequence[str] = ()) -> list[str]:
    """main.py arguments that reproduce ``args``: every value that differs from main.py's default.

    Dests in ``always`` (say, a preset's keys) are written out even when they equal the default.
    """
    parser = build_main_parser()
    argv: list[str] = []
    positional: list[str] = []
    for action in parser._actions:
        if action.dest == "help" or not hasattr(args, action.dest):
            continue
        value = getattr(args, action.dest)
        if value is None:  # only ever a default, and no flag spells it
            continue
        is_default = value == action.default or (
            isinstance(value, (list, tuple)) and list(value) == list(action.default))
        if is_default and action.dest not in always:
            continue
        if action.option_strings:
            argv += flag_tokens(action, value)
        else:
            positional.append(str(value))
    return argv + positional


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
                        help="print the main.py command line the preset stands for and, separately, what "
                        "this machine would change; DIR may be left out; then exit")
    parser.add_argument("--list", action="store_true", help="list the presets of the config file and exit")
    return parser


IMAGENET_CLASSES = 1000


def without_imagenet_count(preset: dict, rest: Sequence[str]) -> dict:
    """``preset`` without its ``num_classes: 1000`` unless the command line asks for a count: ImageNet's
    count is the presets' default, not a choice, so main.py takes the checkpoint's or the dataset's class
    folders instead, as for a run without a preset.  The run and ``--dry-run`` both start from this."""
    typed = build_main_parser().parse_known_args(list(rest))[0].num_classes is not None
    if preset.get("num_classes") != IMAGENET_CLASSES or typed:
        return preset
    return {key: value for key, value in preset.items() if key != "num_classes"}


def class_count_note(args: argparse.Namespace, placeholder: bool) -> str:
    """What the run's class count will be, from the sources main.py asks, in its order
    (``plan.class_count_sources``): the first that is known here, and what follows a checkpoint or weights
    that may record none."""
    from .plan import DEFAULT_NUM_CLASSES, class_count_sources  # torch: as main() does before a dry run

    first, *then = class_count_sources(args)
    if first == "--num-classes":
        return f"# classes: {args.num_classes} (--num-classes)"
    if first == "default":
        return f"# classes: {DEFAULT_NUM_CLASSES} (synthetic data)"
    if first in ("checkpoint", "weights"):
        recorded = "the checkpoint's (--resume)" if first == "checkpoint" else "the weights' (--pretrained-weights)"
        rest = f"{DEFAULT_NUM_CLASSES} (synthetic data)" if then == ["default"] else \
            "one per class folder of the dataset"
        return f"# classes: {recorded}, else {rest}"
    if placeholder:
        return f"# classes: one per class folder of {DIR_PLACEHOLDER}"
    from .data.layout import check_dataset

    try:
        classes = check_dataset(args.data, None, want_train=not args.evaluate, want_val=not args.training_only)
    except UserError as error:
        return f"# classes: one per class folder of {args.data}, but main.py would stop here: {error}"
    return f"# classes: {len(classes)}, one per class folder of {args.data}"


def _notify(message: str) -> None:
    """A one-line notice, from the first process of a job only."""
    from .runtime import distributed_env  # torch: only once a run starts, not for -h or --list

    rank, _, _ = distributed_env()
    if rank == 0:
        print(f"launch.py: {message}", file=sys.stderr, flush=True)


def dry_run_report(title: str, rest: Sequence[str], preset: dict, adapted: dict,
                   notices: Sequence[str], trainer: Sequence[str] = ("python", "main.py")) -> str:
    """``--dry-run``'s text: the preset's main.py command as written, then what this machine changes, then
    the class count the run will use (the dataset's, when the command names one).

    The first command depends on the presets file and the command line only, never on this machine.
    """
    written = parse_args(rest, defaults=preset, require_data=False)
    # adapt_to_host never touches the data flags, so both commands need DIR or neither does
    placeholder = [DIR_PLACEHOLDER] if written.data is None and written.data_backend != "synthetic" else []

    def command(defaults: dict) -> str:
        argv = main_py_argv(parse_args(rest, defaults=defaults, require_data=False), defaults)
        return shlex.join([*trainer, *argv, *placeholder])

    where_dir = f" ({DIR_PLACEHOLDER}: the dataset folder)" if placeholder else ""
    lines = [f"# {title}, as written{where_dir}:", command(preset)]
    if notices:
        lines.append("# on this machine, launch.py would change it:")
        lines += [f"#   {notice}" for notice in notices]
        lines.append(command(adapted))
    else:
        lines.append("# on this machine it runs as written")
    lines.append(class_count_note(written, bool(placeholder)))
    return "\n".join(lines)


def _preset_command(argv: Sequence[str] | None, prog: str) -> tuple[argparse.Namespace, list[str], dict | None]:
    """(launch.py's own flags, main.py's, the preset they pick); no preset for ``--list``."""
    parser = build_parser(prog)
    launch, rest = parser.parse_known_args(argv)
    if launch.list:
        return launch, rest, None
    build_main_parser(prog).refuse_unknown_flags(rest, parser)  # a typo of either's flag, before "missing --model"
    required = ("model", "precision", "mode", "platform")
    missing = [f"--{name}" for name in required if getattr(launch, name) is None]
    if missing:
        raise UserError(f"launch.py: the following arguments are required: {', '.join(missing)}")
    preset = without_imagenet_count(resolve(launch.model, launch.precision, launch.mode, launch.platform,
                                            launch.cfg_file, recipe=launch.recipe), rest)
    return launch, rest, preset


def run_arguments(argv: Sequence[str], prog: str = "launch.py") -> argparse.Namespace | None:
    """main.py's arguments for the run that a launch.py command line starts (the preset as written: what
    this machine changes, the device and the precision, touches no path); None for ``--list`` and
    ``--dry-run``, which start none."""
    launch, rest, preset = _preset_command(argv, prog)
    if preset is None or launch.dry_run:
        return None
    return parse_args(rest, defaults=preset, prog=prog)


def main(argv: Sequence[str] | None = None, *, cuda_available: bool | None = None, prog: str = "launch.py") -> int:
    """Resolve the preset, adapt it to this machine, then train (or describe the run, with --dry-run).

    ``prog``: the command's name; installed as ``ic-launch``, the commands it prints name ``ic-train``.
    """
    trainer = ("python", "main.py") if prog == "launch.py" else ("ic-train",)
    launch, rest, preset = _preset_command(argv, prog)
    if preset is None:
        print(list_presets(launch.cfg_file))
        return 0
    args = parse_args(rest, defaults=preset, require_data=not launch.dry_run, prog=prog)
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    adapted, notices = adapt_to_host(preset, args.device, cuda_available)
    if launch.dry_run:
        recipe = f" --recipe {launch.recipe}" if launch.recipe else ""
        title = (f"{launch.model} {launch.precision} {launch.mode} {launch.platform}{recipe} "
                 f"from {launch.cfg_file}")
        print(dry_run_report(title, rest, preset, adapted, notices, trainer))
        return 0
    for notice in notices:
        _notify(notice)
    if adapted != preset:  # this machine changed preset values: the flags typed still win over them
        args = parse_args(rest, defaults=adapted, prog=prog)
    from .training import train

    return train(args)

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import yaml

from .arguments import (REFERENCE_DEFAULTS, build_parser as build_main_parser, flag_tokens, linear_scaled_lr,
                        parse_args, shown)
from .errors import UserError
from .records.datafile import DataFileError, read_regular, utf8_text
from .system import machine
from .system.cli import UserErrorParser

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


def resolve_layers(model: str, precision: str, mode: str, platform: str,
                   cfg_file: str | Path = DEFAULT_CFG_FILE, recipe: str | None = None) -> list[tuple[str, dict]]:
    """The presets one model x platform x precision x mode (and recipe) stacks, each with where it is in the
    file, in the order they apply (a later one's values win)."""
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
    # the bottom layer: the reference main.py's defaults where a plain run's differ, so a preset is its run
    layers = [("the reference main.py's defaults", REFERENCE_DEFAULTS), (f"precision.{precision}", precision_preset),
              (f"platform.{platform}", platform_preset),
              (f"models.{model}.{platform}.{precision}", precisions[precision] or {})]
    if recipe is not None:
        layers.append((f"recipes.{recipe}", recipe_preset))
    return layers + [(f"mode.{mode}", mode_preset)]


def resolve(model: str, precision: str, mode: str, platform: str,
            cfg_file: str | Path = DEFAULT_CFG_FILE, recipe: str | None = None, typed: Sequence[str] = (),
            world_size: int = 1) -> dict:
    """The preset for one model x platform x precision x mode: a dict of main.py argparse dests.

    ``recipe`` names an entry of the file's ``recipes`` section, whose hyperparameters replace the
    model's own (NVIDIA's) for every platform and precision.  A learning rate stated for a global batch
    (``lr_batch``) is scaled to the run's (:func:`scaled_lr`: ``typed``, the main.py flags of the command
    line, and ``world_size``, its processes, decide that batch)."""
    layers = resolve_layers(model, precision, mode, platform, cfg_file, recipe)
    return fit_recipe_to_mode(scaled_lr(merged(layers), layers, typed, world_size)[0], layers)[0]


def merged(layers: list[tuple[str, dict]]) -> dict:
    return {key: value for _, preset in layers for key, value in preset.items()}


# A preset key that is launch.py's own, not a main.py flag: the global batch the preset's lr is stated for.
LR_BATCH = "lr_batch"


def scaled_lr(preset: dict, layers: list[tuple[str, dict]], typed: Sequence[str] = (), world_size: int = 1
              ) -> tuple[dict, str | None]:
    """``preset`` without its ``lr_batch``, its ``lr`` scaled linearly from that global batch to the run's (as
    NVIDIA's presets are written: 0.256 per 256 images), and the sentence that says how; the preset as it is
    without ``lr_batch``, or when ``--lr`` is typed (the typed value wins, unscaled).  The run's global batch
    is ``--optimizer-batch-size`` when positive, else ``world_size`` processes x ``-b``, each the typed flag's
    or the preset's."""
    if LR_BATCH not in preset:
        return preset, None
    preset = dict(preset)
    reference = preset.pop(LR_BATCH)
    source = _source_of(LR_BATCH, layers)
    if isinstance(reference, bool) or not isinstance(reference, int) or reference < 1:
        raise UserError(f"preset value {LR_BATCH}: {shown(reference)} is not valid: expected the positive global "
                        f"batch size that lr is given for ({source})")
    given = typed_flags(typed, ("lr", "batch_size", "optimizer_batch_size"))
    if "lr" in given or "lr" not in preset:
        return preset, None
    value = lambda key: given.get(key, preset.get(key))  # noqa: E731
    where = lambda key: "typed" if key in given else _source_of(key, layers) or "main.py's default"  # noqa: E731
    optimizer_batch = value("optimizer_batch_size")
    if optimizer_batch is not None and optimizer_batch > 0:
        batch, how = optimizer_batch, f"--optimizer-batch-size ({where('optimizer_batch_size')})"
    else:
        per_process = value("batch_size") or build_main_parser().get_default("batch_size")
        batch = world_size * per_process
        how = f"{world_size} process(es) x -b {per_process} ({where('batch_size')})"
    base = preset["lr"]
    preset["lr"] = float(f"{linear_scaled_lr(batch, base, reference):.12g}")
    return preset, (f"{base:g} ({_source_of('lr', layers)}) for a global batch of {reference} ({source} "
                    f"{LR_BATCH}), scaled to this run's {batch}: {how}")


def fit_recipe_to_mode(preset: dict, layers: list[tuple[str, dict]]
                       ) -> tuple[dict, list[tuple[str, dict]], list[str]]:
    """``preset`` fitted to a mode that runs fewer epochs than its recipe's schedule (the benchmark and evaluate
    modes run 1 to 3), ``layers`` with one more that holds the values it changed (where :func:`value_sources`
    finds them), and a sentence per change: the epochs run train at the crop that the recipe's progressive
    resizing starts with (``train_crop_size``, its MIN; the schedule's START and END lie past them), and the
    triangular rate peaks at the run's last epoch at the latest.  Anything else is unchanged."""
    epochs, source = preset.get("epochs"), _source_of("epochs", layers)
    if epochs is None or not source or not source.startswith("mode."):
        return preset, layers, []
    changed, notes = {}, []
    resize = preset.get("progressive_resize")
    if isinstance(resize, list) and len(resize) == 4 and isinstance(resize[3], int) and resize[3] >= epochs:
        changed.update(progressive_resize=None, train_crop_size=resize[0])
        notes.append(f"{source} runs {epochs} epoch(s), before progressive_resize {resize} "
                     f"({_source_of('progressive_resize', layers)}) would grow the crop: they train at its "
                     f"{resize[0]} px (train_crop_size)")
    peak = preset.get("lr_peak_epoch")
    if preset.get("lr_schedule") == "triangular" and isinstance(peak, int) and peak >= epochs:
        changed["lr_peak_epoch"] = epochs - 1
        notes.append(f"{source} runs {epochs} epoch(s): the triangular rate peaks at the start of epoch {epochs} "
                     f"(lr_peak_epoch {epochs - 1} for {peak})")
    if not changed:
        return preset, layers, []
    recipe = _source_of("progressive_resize", layers) or _source_of("lr_peak_epoch", layers)
    fitted = {key: value for key, value in {**preset, **changed}.items() if key not in changed or value is not None}
    return fitted, [*layers, (f"{recipe} fitted to {source}", changed)], notes


def _source_of(key: str, layers: list[tuple[str, dict]]) -> str | None:
    """The last layer that sets ``key``."""
    return next((name for name, preset in reversed(layers) if key in preset), None)


_UNSET = object()


def typed_flags(rest: Sequence[str], dests: Sequence[str]) -> dict:
    """The values the command line's main.py flags give ``dests`` (only those it gives)."""
    parser = build_main_parser()
    parser.set_defaults(**{dest: _UNSET for dest in dests})
    parsed = parser.parse_known_args(list(rest))[0]
    return {dest: getattr(parsed, dest) for dest in dests if getattr(parsed, dest) is not _UNSET}


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
            isinstance(value, (list, tuple)) and action.default is not None and list(value) == list(action.default))
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
    (``startup.class_count_sources``): the first that is known here, and what follows a checkpoint or weights
    that may record none."""
    from .train.startup import DEFAULT_NUM_CLASSES, class_count_sources  # deferred: torch, for a dry run (as main())

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
    from .data.layout import check_dataset  # deferred: numpy and PIL, for a dry run

    try:
        classes = check_dataset(args.data, None, want_train=not args.evaluate, want_val=not args.training_only)
    except UserError as error:
        return f"# classes: one per class folder of {args.data}, but main.py would stop here: {error}"
    return f"# classes: {len(classes)}, one per class folder of {args.data}"


def _notify(message: str) -> None:
    """A one-line notice, from the first process of a job only."""
    rank, _, _ = machine.distributed_env()
    if rank == 0:
        print(f"launch.py: {message}", file=sys.stderr, flush=True)


def dry_run_report(title: str, rest: Sequence[str], preset: dict, adapted: dict,
                   notices: Sequence[str], trainer: Sequence[str] = ("python", "main.py"),
                   sources: "Sources | None" = None) -> str:
    """``--dry-run``'s text: the preset's main.py command as written, then what this machine changes, then
    the class count the run will use (the dataset's, when the command names one), then, with ``sources``,
    every value of the run as written and where it comes from (:func:`value_sources`).

    The first command depends on the presets file and the command line only, never on this machine (the
    number of processes aside, where a learning rate is scaled to a global batch that depends on it).
    """
    written = parse_args(rest, defaults=preset, require_data=False)
    # adapt_to_host never touches the data flags, so both commands need DIR or neither does
    placeholder = [DIR_PLACEHOLDER] if written.data is None and written.data_backend != "synthetic" else []

    def command(defaults: dict) -> str:
        argv = main_py_argv(parse_args(rest, defaults=defaults, require_data=False), defaults)
        return shlex.join([*trainer, *argv, *placeholder])

    where_dir = f" ({DIR_PLACEHOLDER}: the dataset folder)" if placeholder else ""
    lines = [*(f"# {note}" for note in (sources.fitted if sources else ())), f"# {title}, as written{where_dir}:",
             command(preset)]
    if notices:
        lines.append("# on this machine, launch.py would change it:")
        lines += [f"#   {notice}" for notice in notices]
        lines.append(command(adapted))
    else:
        lines.append("# on this machine it runs as written")
    lines.append(class_count_note(written, bool(placeholder)))
    if sources is not None:
        lines += value_sources(written, rest, sources)
    return "\n".join(lines)


@dataclass
class Sources:
    """Where a preset's values come from: the file's presets it stacks, and how its lr was scaled (or None)."""

    layers: list[tuple[str, dict]]
    lr_note: str | None = None
    fitted: list[str] = field(default_factory=list)  # what fitting a recipe to a short mode changed


VALUES_HEADER = "# every value of the run as written, and where it comes from (a later preset wins, a typed flag most):"


def value_sources(args: argparse.Namespace, rest: Sequence[str], sources: Sources) -> list[str]:
    """A line per main.py option that the command line or a preset sets (its value, then where it is set), and
    the options left at main.py's defaults, with theirs, in a few lines."""
    parser = build_main_parser()
    actions = [action for action in parser._actions if action.dest != "help"]
    typed = typed_flags(rest, [action.dest for action in actions])
    lines, defaults = [VALUES_HEADER], []
    for action in actions:
        value = getattr(args, action.dest)
        name = action.option_strings[-1] if action.option_strings else action.metavar or action.dest
        name = next((flag for flag in action.option_strings if flag.startswith("--")), name)
        source = "typed" if action.dest in typed else _source_of(action.dest, sources.layers)
        if action.dest == "lr" and source != "typed" and sources.lr_note:
            source = sources.lr_note
        if action.dest == "num_classes" and source != "typed" and value is None:
            source = None  # the presets' ImageNet count is left out: the classes line above says which
        if source is None:
            defaults.append(f"{name} {_value_text(action, value)}")
        else:
            lines.append(f"#   {name} {_value_text(action, value)}: {source}")
    lines.append("# main.py's defaults for the rest:")
    row = "#  "
    for item in defaults:
        if len(row) + len(item) + 2 > 110:
            lines.append(row.rstrip(","))
            row = "#  "
        row += f" {item},"
    lines.append(row.rstrip(","))
    return lines


def _value_text(action: argparse.Action, value) -> str:
    if value is None:
        return "none"
    if isinstance(action, argparse.BooleanOptionalAction):
        return "on" if value else "off"
    if action.nargs == 0:  # store_true / store_false: whether the flag itself is given
        return "on" if value == action.const else "off"
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return str(value)


def _preset_command(argv: Sequence[str] | None, prog: str
                    ) -> tuple[argparse.Namespace, list[str], dict | None, Sources | None]:
    """(launch.py's own flags, main.py's, the preset they pick, where its values come from); no preset for
    ``--list``."""
    parser = build_parser(prog)
    launch, rest = parser.parse_known_args(argv)
    if launch.list:
        return launch, rest, None, None
    main_parser = build_main_parser(prog)
    main_parser.refuse_unknown_flags(rest, parser)  # a typo of either's flag, before "missing --model"
    rest = main_parser.expand_prefixes(rest)  # said once here; every later parse reads the whole flags
    required = ("model", "precision", "mode", "platform")
    missing = [f"--{name}" for name in required if getattr(launch, name) is None]
    if missing:
        raise UserError(f"launch.py: the following arguments are required: {', '.join(missing)}")
    layers = resolve_layers(launch.model, launch.precision, launch.mode, launch.platform, launch.cfg_file,
                            recipe=launch.recipe)
    preset, lr_note = scaled_lr(merged(layers), layers, rest, _world_size())
    preset, layers, fitted = fit_recipe_to_mode(preset, layers)
    return launch, rest, without_imagenet_count(preset, rest), Sources(layers, lr_note, fitted)


def _world_size() -> int:
    """The processes of this launch (torchrun's and SLURM's variables; 1 alone)."""
    return machine.distributed_env()[2]


def run_arguments(argv: Sequence[str], prog: str = "launch.py") -> argparse.Namespace | None:
    """main.py's arguments for the run that a launch.py command line starts (the preset as written: what
    this machine changes, the device and the precision, touches no path); None for ``--list`` and
    ``--dry-run``, which start none."""
    launch, rest, preset, _ = _preset_command(argv, prog)
    if preset is None or launch.dry_run:
        return None
    return parse_args(rest, defaults=preset, prog=prog)


def torch_sees_cuda(device: str) -> bool:
    """Whether torch finds a CUDA device, asked only where it matters (not under ``--device cpu``) and of torch only
    where NVIDIA's driver is there: without one torch can find none, and its import takes seconds, which a
    ``--dry-run`` on a machine without a GPU need not wait for."""
    if device == "cpu" or machine.gpu_driver() is None:
        return False
    import torch

    return torch.cuda.is_available()


def main(argv: Sequence[str] | None = None, *, cuda_available: bool | None = None, prog: str = "launch.py") -> int:
    """Resolve the preset, adapt it to this machine, then train (or describe the run, with --dry-run).

    ``prog``: the command's name; installed as ``ic-launch``, the commands it prints name ``ic-train``.
    """
    trainer = ("python", "main.py") if prog == "launch.py" else ("ic-train",)
    launch, rest, preset, sources = _preset_command(argv, prog)
    if preset is None:
        print(list_presets(launch.cfg_file))
        return 0
    args = parse_args(rest, defaults=preset, require_data=not launch.dry_run, prog=prog)
    if not launch.dry_run:
        from .train.startup import check_before_torch  # deferred: numpy and PIL (the dataset check), past -h

        check_before_torch(args)  # the dataset and the workspace, before torch's import (seconds)
    if cuda_available is None:
        cuda_available = torch_sees_cuda(args.device)
    adapted, notices = adapt_to_host(preset, args.device, cuda_available)
    if launch.dry_run:
        recipe = f" --recipe {launch.recipe}" if launch.recipe else ""
        title = (f"{launch.model} {launch.precision} {launch.mode} {launch.platform}{recipe} "
                 f"from {launch.cfg_file}")
        print(dry_run_report(title, rest, preset, adapted, notices, trainer, sources))
        return 0
    for notice in [*sources.fitted, *notices]:
        _notify(notice)
    if adapted != preset:  # this machine changed preset values: the flags typed still win over them
        args = parse_args(rest, defaults=adapted, prog=prog)
    from .training import train  # deferred: torch

    return train(args)

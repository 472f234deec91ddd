"""The command lines, defined once: main.py's here, the other commands' (classify.py, checkpoint2model.py,
model2onnx.py, data.pack) in :mod:`.tools`.

Every flag of the reference README's ``main.py -h`` keeps its name and meaning; the later reference
flags and our own additions sit beside them in small groups, a module each: :mod:`.data` (with the
dataset DIR), :mod:`.model`, :mod:`.optimisation`, :mod:`.precision` (precision and device),
:mod:`.deployed` (evaluation of the deployed model) and :mod:`.run` (run, checkpoints and logging).  Each
holds its group's frozen dataclass, whose fields are the flags (:func:`.values.flag`: a new flag is one field
in one group), and the checks of their values; the run's configuration (``train.plan.RunConfig``) is those
dataclasses, built from the parsed flags (:func:`.values.from_args`) and completed once with what the run
settles.  :mod:`.parsing` builds the parser from the groups and runs the checks; ``launch.py``'s presets reach
:func:`parse_args` as ``defaults``, written as the flags they set and put before the typed ones, so that
explicit flags still win.  A plain run's defaults are the
reference's but for the learning rate (scaled to the global batch), the last BatchNorm of each residual
block (zero) and the memory format (``auto``); :data:`REFERENCE_DEFAULTS` holds the reference's values, which
the presets start from.

No torch here (nor in what this imports): ``-h`` and a mistyped flag answer before torch is loaded,
which takes seconds.

May import: models/ (the architectures' names), system/ (the argument types of cli, GPU-affinity modes, the
machine's facts that help texts name), errors.
"""

from .data import (AUGMENTATIONS, BACKEND_ALIASES, DATA_BACKENDS, DEFAULT_WORKERS, INTERPOLATIONS, MIN_IMAGE_SIZE,
                   RANDAUGMENT_BINS, VAL_TTA)
from .model import model_options
from .optimisation import (DEFAULT_LR_PEAK_EPOCH, LR_BASE, LR_BASE_BATCH, LR_SCHEDULES, MIN_MIXUP, OPTIMIZERS,
                           REFERENCE_LR_PER_IMAGE, WARN_LR_FACTOR, check_optimisation_combinations, global_batch,
                           linear_scaled_lr, resolve_lr)
from .parsing import (REFERENCE_DEFAULTS, build_parser, check_values, flag_tokens, parse_args, preset_tokens,
                      validate_args)
from .run import DEFAULT_RAPORT_FILE, CheckpointInterval, raport_file
from .values import FLOAT32_MAX, MAX_WAIT_S, shown

__all__ = [
    "AUGMENTATIONS", "BACKEND_ALIASES", "DATA_BACKENDS", "DEFAULT_LR_PEAK_EPOCH", "DEFAULT_RAPORT_FILE",
    "DEFAULT_WORKERS", "FLOAT32_MAX", "INTERPOLATIONS", "LR_BASE", "LR_BASE_BATCH", "LR_SCHEDULES", "MAX_WAIT_S",
    "MIN_IMAGE_SIZE", "MIN_MIXUP", "OPTIMIZERS", "RANDAUGMENT_BINS", "REFERENCE_DEFAULTS", "REFERENCE_LR_PER_IMAGE",
    "VAL_TTA", "WARN_LR_FACTOR", "CheckpointInterval", "build_parser", "check_optimisation_combinations",
    "check_values", "flag_tokens", "global_batch", "linear_scaled_lr", "model_options", "parse_args", "preset_tokens",
    "raport_file", "resolve_lr", "shown", "validate_args",
]

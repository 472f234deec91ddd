"""The checks a run makes before it writes anything, in the order a user meets them: the dataset, then the
workspace (its names, a folder that cannot be written, another run holding it) and the run it already holds, which
a new run must not replace unasked; with torch, a data backend this machine lacks.

:func:`preflight` makes the checks that need no torch, in one order, for main.py and launch.py before they import
torch (seconds), for multiproc.py before it starts a process, and for a launched process in the run itself (rank 0
checks the workspace), so a refused start leaves no workspace folder and no lock file either way.  No torch here,
nor in what this imports at the top.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..arguments import raport_file
from ..data.layout import check_dataset
from ..errors import UserError
from ..records.datafile import open_own
from ..records.raport import check_tensorboard
from ..records.workspace import Workspace

DEFAULT_WORKSPACE = "./"  # --workspace's default (arguments.py)


def workspace_folder(args: argparse.Namespace) -> str:
    """Where the run writes: ``--workspace``; an evaluation of a checkpoint file (``--evaluate --resume PATH``)
    given none writes beside that file, in the workspace of the run that saved it, rather than into the
    current folder, where its raport would stand in the way of the next run started there."""
    if args.evaluate and args.workspace == DEFAULT_WORKSPACE and args.resume and args.resume != "auto":
        return os.path.dirname(args.resume) or DEFAULT_WORKSPACE
    return args.workspace


def workspace_of(args: argparse.Namespace) -> Workspace:
    """The workspace a run with ``args`` writes into (:func:`workspace_folder`), named in messages as the user
    gave it: ``--workspace``, or the folder of the checkpoint an evaluation writes its raport beside."""
    folder = workspace_folder(args)
    named = None
    if folder != args.workspace:
        named = (f"{folder} (the folder of --resume {args.resume}, where an evaluation writes its raport unless "
                 "--workspace says where)")
    return Workspace(folder, args.checkpoint_filename, raport_file(args), named)


def workspace_notice(args: argparse.Namespace) -> str:
    """A run's first line: the folder it writes into, as an absolute path, where it comes from, and the flag that
    moves it (a run given no --workspace writes into the current folder, which nothing else would say)."""
    folder = workspace_folder(args)
    if args.workspace != DEFAULT_WORKSPACE:
        return f"=> workspace: {os.path.abspath(folder)} (--workspace)"
    whose = "the current folder" if folder == DEFAULT_WORKSPACE else "the folder of --resume's checkpoint"
    return f"=> workspace: {os.path.abspath(folder)} ({whose}: --workspace DIR writes the run elsewhere)"


def check_workspace(args: argparse.Namespace, workspace: Workspace) -> None:
    """What the workspace itself refuses (its names, a folder where a checkpoint or a copy of it goes, a folder
    that cannot be written, another run holding it), and a ``--tensorboard`` folder that cannot be written,
    found without writing anything; rank 0 checks them first."""
    workspace.check(args.save_checkpoints and not args.evaluate, locking=not args.evaluate,
                    raport_must_be_new=args.evaluate and args.raport_file is not None,
                    gathering=args.gather_checkpoints != 0)
    if args.tensorboard:
        check_tensorboard(args.tensorboard)


# set by torchrun, multiproc.py and srun in each process they start (srun also in a batch script's own process)
LAUNCHER_VARIABLES = ("WORLD_SIZE", "RANK", "SLURM_PROCID")


def launched() -> bool:
    """Whether a launcher (torchrun, multiproc.py, srun) started this process: its checks wait for its rank."""
    return any(name in os.environ for name in LAUNCHER_VARIABLES)


def preflight(args: argparse.Namespace, *, workspace: bool = True, earlier_run: bool = False) -> list[str]:
    """The checks of a run that need neither torch nor a device, in the order a user meets them: the dataset (a
    missing val/ names --training-only), then (``workspace``: where rank 0 runs) the workspace's names, a folder
    that cannot be written, another run holding it, and (``earlier_run``) the run it already holds, which a new run
    must not replace unasked; a run checks that itself once it has checked the data backend, which needs torch.
    main.py and launch.py make them before they import torch (seconds), multiproc.py before it starts a process,
    so that such a mistake is one line and exit 2 with nothing written; a process that a launcher started makes
    them in the run, where its rank is known.  The dataset's class folders, in label order."""
    classes = dataset_classes(args)
    if workspace:
        folder = workspace_of(args)
        check_workspace(args, folder)
        if earlier_run:
            check_fresh_start(args, folder, log=lambda line: None)
    return classes


def check_backend(backend: str, is_cuda: bool, augmentation: str | None, *, training: bool) -> None:
    """Refuse a data backend this machine cannot run (``dali-gpu`` or ``pytorch-gpu`` without CUDA, DALI not
    installed, a torchvision that cannot decode on the GPU) or that lacks the asked ``--augmentation``, before the
    workspace is looked at."""
    if backend == "pytorch-gpu":
        from ..data.device_decode import check_device_decode_request  # deferred: torchvision's decoders

        check_device_decode_request(is_cuda, augmentation, training=training)
    if backend in ("dali-cpu", "dali-gpu"):
        from ..data.dali import check_dali_request  # deferred: torch (data.dali's), checked here before its import

        check_dali_request(backend, is_cuda, augmentation, training=training)


def dataset_classes(args: argparse.Namespace) -> list[str]:
    """The class folders, checked once before anything is built; none for synthetic data (the default backend is
    never synthetic)."""
    if args.data_backend == "synthetic":
        return []
    return check_dataset(args.data, sys.maxsize, want_train=not args.evaluate, want_val=not args.training_only)


DEFAULT_NUM_CLASSES = 1000  # ImageNet's: the count of a run with no class folders to count (synthetic data)


def class_count_sources(args: argparse.Namespace) -> list[str]:
    """Where the run takes its class count from, in the order it asks them, the first that knows winning:
    ``--num-classes``; ``checkpoint`` (``--resume``) or ``weights`` (``--pretrained-weights`` under
    ``--evaluate``), either of which may record none; then the ``dataset``'s class folders, or ``default``
    (:data:`DEFAULT_NUM_CLASSES`) for synthetic data.  :func:`plan.resolve_num_classes` and ``launch.py --dry-run``
    both follow it."""
    if args.num_classes is not None:
        return ["--num-classes"]
    recorded = ["checkpoint"] if args.resume else ["weights"] if args.evaluate and args.pretrained_weights else []
    return recorded + (["default"] if args.data_backend == "synthetic" else ["dataset"])


def check_fresh_start(args: argparse.Namespace, workspace: Workspace, log) -> None:
    """A new run must not silently replace the run whose checkpoints, or whose raport (a run without
    checkpoints leaves only that), the workspace already holds."""
    if args.resume or args.evaluate:
        return
    checkpoints, raport = earlier_run(args, workspace)
    if not checkpoints and raport is None:
        return
    if args.overwrite:
        replaced = ", ".join(path.name for path in [*checkpoints[:1], *([raport] if raport else [])])
        log(f"=> --overwrite: this run replaces the one in {workspace.path} ({replaced})")
        return
    if checkpoints:
        raise UserError(f"{workspace.path} already holds another run ({checkpoints[0].name}); pass --resume auto to "
                        "continue it, a new --workspace for a new run, or --overwrite to replace it")
    if args.save_checkpoints and _stopped_before_saving(raport):
        raise UserError(f"--raport-file {raport} holds the records of a run that stopped before its first "
                        "checkpoint; pass --resume auto to run it again from its first step, another --raport-file "
                        "or a new --workspace for a new run, or --overwrite to replace them")
    raise UserError(f"--raport-file {raport} already holds another run's records; give this run another "
                    "--raport-file or a new --workspace, or pass --overwrite to replace them")


def _stopped_before_saving(raport: Path) -> bool:
    """Whether ``raport`` is a training run's that would have saved checkpoints (its first PARAMETER record
    says so), not one of a run with ``--no-checkpoints`` or of an evaluation: a run stopped (Ctrl-C, SIGTERM
    during start-up) or killed before its first save, which the same command with ``--resume auto`` runs again."""
    try:
        with open_own(raport, "rb") as handle:
            first = handle.readline(1 << 20)
        record = json.loads(first[len(b"DLLL "):]) if first.startswith(b"DLLL ") else None
    except (OSError, ValueError, RecursionError):
        return False
    data = record.get("data") if isinstance(record, dict) and record.get("step") == "PARAMETER" else None
    return isinstance(data, dict) and data.get("save_checkpoints") is True and data.get("evaluate") is False


def earlier_run(args: argparse.Namespace, workspace: Workspace) -> tuple[list[Path], Path | None]:
    """What a run with ``args`` would replace in ``workspace``: the checkpoints it would write over (the latest
    first), and its raport where that holds records (a run without checkpoints leaves only that)."""
    checkpoints = [path for path in (workspace.latest, workspace.best) if args.save_checkpoints and path.exists()]
    return checkpoints, workspace.raport if _holds_records(workspace.raport) else None


def _holds_records(path) -> bool:
    """Whether ``path`` is a file with something in it (a raport that holds records, or a file of the user's
    that a raport would overwrite); an empty file holds nothing to lose."""
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:
        return False


def class_count_note(args: argparse.Namespace, placeholder: str | None = None) -> str:
    """What the run's class count will be, from the sources main.py asks, in its order
    (``startup.class_count_sources``): the first that is known here, and what follows a checkpoint or weights
    that may record none; ``placeholder``: what a ``--dry-run`` without DIR names the dataset folder."""
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
        return f"# classes: one per class folder of {placeholder}"
    try:
        classes = check_dataset(args.data, None, want_train=not args.evaluate, want_val=not args.training_only)
    except UserError as error:
        return f"# classes: one per class folder of {args.data}, but main.py would stop here: {error}"
    return f"# classes: {len(classes)}, one per class folder of {args.data}"

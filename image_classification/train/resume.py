"""What a run continues from, and whether it may: the checkpoint ``--resume`` names (``auto``: the valid one of the
workspace furthest along, chosen by rank 0), its recorded position held to the flags' rules, and the classes it
records held against the dataset's class folders."""

from __future__ import annotations

import math
import os

import torch.distributed as dist

from ..data.files import printable
from ..errors import UserError
from ..records import checkpoint as ckpt
from ..records.integrity import recorded_description
from ..records.workspace import Workspace
from ..system.runtime import Runtime


def _broadcast_choice(value, runtime: Runtime):
    """Rank 0's ``value`` on every rank (a collective in distributed runs)."""
    if not runtime.distributed:
        return value
    box = [value]
    with runtime.waiting_for_peers("waiting for rank 0's choice of checkpoint"):
        dist.broadcast_object_list(box, src=0)
    return box[0]


def find_resume_checkpoint(resume: str | None, weights: str | None, workspace: Workspace, runtime: Runtime, log
                           ) -> tuple[str | None, dict | None]:
    """(path, checkpoint) that ``--resume`` names; ``auto``: the valid one of the workspace furthest along, or none.
    With ``--pretrained-weights`` (``weights``: a fine-tune that is requeued), what ``auto`` found is said beside
    the weights: they start the run, a checkpoint continues it."""
    if not resume:
        return None, None
    if resume != "auto":
        if not os.path.isfile(resume):
            raise UserError(f"--resume {resume}: no such checkpoint file")
        log(f"=> loading checkpoint '{resume}'")
        return resume, ckpt.load_checkpoint(resume)
    chosen, state = furthest_checkpoint(workspace.resume_candidates(), log) if runtime.is_main else (None, None)
    chosen = _broadcast_choice(chosen, runtime)
    if chosen is None:
        start = f"the pretrained weights '{weights}'" if weights else "scratch"
        log(f"=> --resume auto: no checkpoint in {workspace.path}; starting from {start}")
        return None, None
    beside = f" (the run continues from it; --pretrained-weights '{weights}' only started it)" if weights else ""
    log(f"=> --resume auto: loading checkpoint '{chosen}'{beside}")
    return chosen, state if state is not None else ckpt.load_checkpoint(chosen)


def recorded_progress(state: dict) -> tuple[int, int]:
    """How far a checkpoint's run got: (epochs finished, batches of the next one)."""
    return state["epoch"], state.get("batch", 0)


def furthest_checkpoint(candidates: list, log) -> tuple[str | None, dict | None]:
    """(path, checkpoint) of the one among ``candidates`` (in the order that wins a tie) whose recorded progress is
    furthest along, its hash verified; a damaged one is named in a line and passed over.  A per-epoch file is
    read only when its name promises more than the best one read so far (the last epoch's comes first)."""
    chosen, state = None, None
    for candidate in candidates:
        index = ckpt.epoch_checkpoint_index(candidate.name)
        if state is not None and index is not None and (index + 1, 0) <= recorded_progress(state):
            continue
        try:
            loaded = ckpt.load_checkpoint(candidate)
            check_progress(loaded, str(candidate))
        except UserError as error:
            log(f"=> cannot resume from {candidate}: {error}; trying the other checkpoints")
            continue
        if state is None or recorded_progress(loaded) > recorded_progress(state):
            chosen, state = str(candidate), loaded
    return chosen, state


def class_label_changes(recorded: list[str], classes: list[str]) -> list[str]:
    """What changed between the class names a checkpoint records, in label order, and the dataset's: each class
    at another label ("class_01 from label 1 to 0"), each new one at a label the checkpoint trained ("class_zz
    (new) at class_02's label 2"), then each recorded class gone; [] when every label the two share names the
    same class (classes added after the last one, or the last ones removed, move nothing)."""
    if all(then == now for then, now in zip(recorded, classes)):
        return []
    before, changes = {name: label for label, name in enumerate(recorded)}, []
    for label, name in enumerate(classes):
        if name in before and before[name] != label:
            changes.append(f"{printable(name)} from label {before[name]} to {label}")
        elif name not in before and label < len(recorded):
            changes.append(f"{printable(name)} (new) at {printable(recorded[label])}'s label {label}")
    now = set(classes)
    return changes + [f"{printable(name)} is gone" for name in recorded if name not in now]


def check_class_labels(weights: dict | None, classes: list[str], source: str | None, allowed: bool, log) -> None:
    """Refuse weights (a checkpoint resumed or evaluated) whose recorded classes sit at other labels than the
    dataset's class folders give them: every image of such a class would train, or be scored on, another class's
    output.  One line naming the classes that moved; ``allowed`` (``--allow-class-changes``) goes on, said."""
    recorded = recorded_description(weights).get("classes") if weights is not None else None
    if not classes or not isinstance(recorded, list) or not all(isinstance(name, str) for name in recorded):
        return
    changes = class_label_changes(recorded, classes)
    if not changes:
        return
    shown = ", ".join(changes[:6]) + (f" and {len(changes) - 6} more" if len(changes) > 6 else "")
    moved = f"the class folders do not give the labels {source} was trained with: {shown}"
    if allowed:
        log(f"=> --allow-class-changes: {moved}; each label now stands for the class the folders give it")
        return
    raise UserError(f"{moved}; every image of those classes would train, or be scored on, another class's "
                    "output: restore the class folders' names, or pass --allow-class-changes to go "
                    "on with the labels they give now")


PROGRESS_COUNTS = ("epoch", "batch", "optimizer_steps", "skipped_steps", "iterations", "epochs_without_improvement",
                   "ema_updates")


def check_progress(state: dict, path: str) -> None:
    """A checkpoint's position and seed, held to the flags' rules: a crafted or damaged value whose hash
    still matches is one line, not a traceback later."""
    def whole(value, low: int, high: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and low <= value < high

    for name in PROGRESS_COUNTS:
        if not whole(state.get(name, 0), 0, 2**62):
            raise UserError(f"{path} records {name} = {str(state.get(name))[:40]}, not a count; it cannot be resumed")
    for name, low in (("seed", 0), ("world_size", 1), ("batch_size", 1)):
        if state.get(name) is not None and not whole(state[name], low, 2**63):
            raise UserError(f"{path} records {name} = {str(state[name])[:40]}, out of range; it cannot be resumed")
    best = state.get("best_prec1", 0.0)
    if not (isinstance(best, (int, float)) and math.isfinite(best)):
        raise UserError(f"{path} records best_prec1 = {str(best)[:40]}, not a number; it cannot be resumed")

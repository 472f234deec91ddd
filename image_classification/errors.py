"""The errors a user can cause, and the exit codes they end a script with.

Each is explained in one sentence on stderr; the exit code tells a scheduler what happened:

* 2 (:class:`UserError`): bad input: a flag, a dataset, a weights file, a workspace;
* 3 (:class:`TrainingDiverged`): the training loss, the gradients (fp16 steps skipped in a row) or the weights
  stopped being finite, or an evaluation's outputs did; nothing was saved from them;
* 4 (:class:`StorageError`): a file could not be written (disk full, read-only); the previous files are intact;
* 5 (:class:`PeerLost`): a process of a distributed run stopped because another one is gone (killed,
  crashed); the launcher, multiproc.py, names the one that failed and itself exits 1;
* 75 (:data:`EXIT_PREEMPTED`): stopped early by SIGTERM or SIGUSR1 after saving; ``--resume`` continues.

:func:`write_failure` turns an OSError of a writer into its one line: exit 2 where the place is read-only, 4
where the disk is full.
"""

import errno

EXIT_PREEMPTED = 75  # sysexits.h's EX_TEMPFAIL: "a temporary failure; the user is invited to retry"


class UserError(Exception):
    """A mistake in the user's input (flags, dataset, weights file), explained in one sentence."""

    exit_code = 2


class TrainingDiverged(UserError):
    """The training loss, the gradients, the weights or an evaluation's outputs are no longer finite numbers."""

    exit_code = 3


class StorageError(UserError):
    """A checkpoint or raport could not be written; whatever was there before is left as it was."""

    exit_code = 4


# a place that cannot be written at all, which the user fixes by choosing another (exit 2)
READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def write_failure(what: str, error: OSError, outcome: str = "") -> UserError:
    """The one line for ``what`` (``--tensorboard runs``, ``DST packed``), which ``error`` stopped from being
    written, ``outcome`` (what was kept) after it: a :class:`UserError` (exit 2) where the place is read-only or
    may not be written (EROFS, EACCES, EPERM), a :class:`StorageError` (exit 4) for a full disk (ENOSPC, EDQUOT)
    and any other failure of the storage."""
    reason = error.strerror or str(error) or type(error).__name__
    tail = f"; {outcome}" if outcome else ""
    if error.errno in READ_ONLY_ERRNOS:
        return UserError(f"{what} cannot be written ({reason}){tail}")
    return StorageError(f"{what} could not be written ({reason}){tail}")


class PeerLost(UserError):
    """Another process of a distributed run is gone (a collective call broke); this one stops too.

    Its own exit code differs from a crash's (1) so that the launcher can tell the consequence from the cause.
    """

    exit_code = 5

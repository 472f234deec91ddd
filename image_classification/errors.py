"""The errors a user can cause, and the exit codes they end a script with.

Each is explained in one sentence on stderr; the exit code tells a scheduler what happened:

* 2 (:class:`UserError`): bad input: a flag, a dataset, a weights file, a workspace;
* 3 (:class:`TrainingDiverged`): the training loss, the gradients (fp16 steps skipped in a row) or the weights
  stopped being finite, or an evaluation's outputs did; nothing was saved from them;
* 4 (:class:`StorageError`): a file could not be written (disk full, read-only); the previous files are intact;
* 5 (:class:`PeerLost`): a process of a distributed run stopped because another one is gone (killed,
  crashed); the launcher, multiproc.py, names the one that failed and itself exits 1;
* 75 (:data:`EXIT_PREEMPTED`): stopped early by SIGTERM or SIGUSR1 after saving; ``--resume`` continues.
"""

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


class PeerLost(UserError):
    """Another process of a distributed run is gone (a collective call broke); this one stops too.

    Its own exit code differs from a crash's (1) so that the launcher can tell the consequence from the cause.
    """

    exit_code = 5

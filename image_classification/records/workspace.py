"""The workspace a run writes into: checked before the first step, locked while the run lives.

* :meth:`Workspace.check` refuses, with one line each and without writing anything, a workspace that is a
  file, cannot be written or is in use by another run, a ``--checkpoint-filename`` / ``--raport-file``
  that is empty, too long for the file system, outside the workspace, or the same file as a checkpoint, the
  lock or each other, and a folder where a file the run writes will go (the checkpoint, the best model, a
  per-epoch file); a run calls it first, and creates the workspace (:meth:`Workspace.prepare`) only once
  every other check of its set-up has passed too;
* a save writes the latest checkpoint first, then its copies (:meth:`Workspace.copies`: the per-epoch file,
  the best model), so that a copy that cannot be written never holds back the run's progress; a save
  stopped between them (a kill, a full disk) leaves copies behind, which :meth:`Workspace.owed_copies`
  finds and the resumed run writes first;
* :meth:`Workspace.lock` holds an exclusive ``flock`` on ``.workspace.lock``: a second run on the same
  workspace stops with the first one's pid and host.  The lock dies with the run's process, SIGKILL
  included: fork()ed children (DataLoader workers) close their copy of it at once, and a lock that
  outlives its recorded holder all the same (kept by a child that inherited it otherwise) is taken over;
* temporary files left by a killed save are removed once the lock is held;
* :func:`writer_stamp` names a process in a temporary file's name, so that files written without a lock
  (the ONNX cache's) can be told apart: left by a writer that died, or still being written;
* :meth:`Workspace.resume_candidates` lists the checkpoints ``--resume auto`` may continue from;
* :meth:`Workspace.claim_evaluation_raport` gives an evaluation a raport file of its own.
"""

from __future__ import annotations

import datetime
import errno
import filecmp
import hashlib
import json
import os
import re
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from ..errors import StorageError, UserError
from .checkpoint import (BEST_NAME, TEMP_SUFFIX, copy_atomic, epoch_checkpoint_name, epoch_checkpoints,
                         is_epoch_checkpoint_name, longest_name, position_text, prune_epoch_checkpoints,
                         temporary_name)
from .datafile import (folder_problem, nearest_existing, open_own, own_file_problem, parse_json, read_regular,
                       refused_own_file)

LOCK_NAME = ".workspace.lock"
MAX_LOCK_RECORD_BYTES = 1 << 16  # the lock's record of its holder: host, pid, start, a few hundred bytes
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]+" + re.escape(TEMP_SUFFIX) + "$")

try:
    import fcntl
except ImportError:  # not POSIX: no locking, every other check still applies
    fcntl = None

_HELD: list[TextIO] = []  # the lock files this process holds


def _close_in_child() -> None:
    """A fork()ed child (a DataLoader worker) drops its copy of the run's lock.

    flock belongs to the open file, which a fork shares: a worker that kept it would hold the workspace
    for the seconds it outlives a SIGKILLed run.  Closing the child's descriptor leaves the parent's lock
    as it is.  Close-on-exec does not help here: the workers are forked, never exec()ed.
    """
    for handle in _HELD:
        handle.close()
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat's 22nd field); None when it
    is gone or a zombie.  Raises OSError where /proc cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if not os.path.isdir("/proc/self"):
            raise
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name, in parentheses, may hold spaces
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _holder_record() -> dict:
    """Who holds the lock, as the next run needs to know it to tell a dead holder from a live one."""
    record = {"pid": os.getpid(), "host": socket.gethostname(), "pidns": _pid_namespace()}
    try:
        record["start"] = _process_start(os.getpid())
    except OSError:
        record["start"] = None
    return record


def holder_is_dead(record: dict) -> bool:
    """Whether the process a lock file names is proven gone: on this machine and in this pid namespace,
    with no live process of that pid that started when it did (a reused pid is another process)."""
    if record.get("host") != socket.gethostname() or record.get("pidns") != _pid_namespace():
        return False  # another machine or container: its processes cannot be seen from here
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        start = _process_start(pid)
    except OSError:  # no /proc: a signal 0 tells whether the pid is in use, not by whom
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False
    return start is None or start != record.get("start")


def _machine(record: dict) -> str:
    """A short tag of a record's host and pid namespace: where its pid means that process."""
    return hashlib.sha256(f"{record.get('host')}|{record.get('pidns')}".encode()).hexdigest()[:12]


def writer_stamp() -> str:
    """This process as ``pid-start-machine``, for the name of a temporary file it writes: another process
    can then tell (:func:`stamp_is_dead`) a file left by a writer that died from one still being written."""
    record = _holder_record()
    start = "x" if record["start"] is None else record["start"]
    return f"{record['pid']}-{start}-{_machine(record)}"


def stamp_is_dead(stamp: str) -> bool:
    """Whether the writer a :func:`writer_stamp` names is proven gone (as :func:`holder_is_dead` tells);
    False for a stamp of another machine or container, or one that is not a stamp."""
    match = re.fullmatch(r"(\d+)-(\d+|x)-([0-9a-f]{12})", stamp)
    here = {"host": socket.gethostname(), "pidns": _pid_namespace()}
    if match is None or match[3] != _machine(here):
        return False
    start = None if match[2] == "x" else int(match[2])
    return holder_is_dead({**here, "pid": int(match[1]), "start": start})


def try_flock(handle: TextIO, mode: int | None = None) -> bool | None:
    """Lock ``handle``'s file (``mode``: exclusively unless given): True when done, False when another process
    holds it, None when the file system has no locks.  The workspace's lock, and the pack's (data/pack_destination)."""
    try:
        fcntl.flock(handle.fileno(), (fcntl.LOCK_EX if mode is None else mode) | fcntl.LOCK_NB)
    except OSError as error:
        return False if error.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK) else None
    return True


def _recorded_holder_is_dead(path: Path) -> bool:
    """Whether the lock file names a holder that is proven dead (then only its children can hold it)."""
    try:
        lines = read_regular(path, MAX_LOCK_RECORD_BYTES).decode("utf-8").splitlines()
        record = parse_json(lines[1], MAX_LOCK_RECORD_BYTES)
    except (OSError, IndexError, ValueError):  # ValueError: not UTF-8, or no JSON within datafile's bounds
        return False  # written by an older version, or half written: cannot tell
    return isinstance(record, dict) and holder_is_dead(record)


class Workspace:
    def __init__(self, path: str | os.PathLike, checkpoint_filename: str, raport_file: str, named: str | None = None):
        """``named``: how messages call the folder (``--workspace PATH`` unless given: a folder the user did not
        name, say where it comes from)."""
        self.path = Path(path)
        self.named = named or f"--workspace {self.path}"
        self.checkpoint_filename = checkpoint_filename
        self.raport_file = raport_file
        self._lock_handle = None

    @property
    def latest(self) -> Path:
        return self.path / self.checkpoint_filename

    @property
    def best(self) -> Path:
        return self.path / BEST_NAME

    @property
    def raport(self) -> Path:
        return self.path / self.raport_file

    # -- checks -----------------------------------------------------------------------------------
    def check_names(self, saving: bool) -> None:
        """File names that cannot work, leave the workspace, or would overwrite one another are refused.

        Paths are compared resolved (``sub/../checkpoint.pth.tar`` is ``checkpoint.pth.tar``), and the
        raport is checked against the checkpoints even when this run saves none: it would truncate the
        file that ``--resume`` reads.
        """
        limit = longest_name(self.path)
        for flag, name in (("--raport-file", self.raport_file),) + (
                (("--checkpoint-filename", self.checkpoint_filename),) if saving else ()):
            if not name or not name.strip() or Path(name).name in ("", ".", ".."):
                raise UserError(f"{flag} needs a file name, got {name!r}")
            if Path(name).is_absolute():
                raise UserError(f"{flag} is a name inside --workspace, not an absolute path: {name}")
            if Path(os.path.normpath(name)).parts[0] == "..":
                raise UserError(f"{flag} {name} leads out of --workspace; give a name inside it")
            for part in Path(name).parts:
                if len(os.fsencode(part)) > limit:
                    raise UserError(f"{flag} is too long for the file system: {part[:40]}... has "
                                    f"{len(os.fsencode(part))} bytes, a file name there at most {limit}")
        folder, raport, latest = self.path.resolve(), self.raport.resolve(), self.latest.resolve()
        taken = {latest: "--checkpoint-filename", folder / BEST_NAME: f"the best model, {BEST_NAME}",
                 folder / LOCK_NAME: f"the workspace's lock, {LOCK_NAME}"}
        if raport.parent == folder and is_epoch_checkpoint_name(raport.name):
            taken[raport] = "a per-epoch checkpoint (--gather-checkpoints)"
        if raport in taken:
            raise UserError(f"--raport-file {self.raport_file} is the same file as {taken[raport]}: the "
                            "raport would overwrite it; choose another name, such as experiment_raport.json")
        if not saving:
            return
        name = Path(self.checkpoint_filename).name
        if name == BEST_NAME or is_epoch_checkpoint_name(name):
            raise UserError(f"--checkpoint-filename {self.checkpoint_filename} would be overwritten by the "
                            f"{'best model' if name == BEST_NAME else 'per-epoch checkpoints'}; choose another "
                            "name, such as checkpoint.pth.tar")
        if latest == folder / LOCK_NAME:
            raise UserError(f"--checkpoint-filename {self.checkpoint_filename} is the workspace's lock file; "
                            "choose another name, such as checkpoint.pth.tar")

    def check(self, saving: bool, *, locking: bool = True, raport_must_be_new: bool = False,
              gathering: bool = False) -> None:
        """What :meth:`prepare` would refuse, and (``locking``: for a run that will take the lock) a workspace in
        use by another run, found without writing anything (nor creating the workspace): a run that stops
        here leaves no trace.  ``raport_must_be_new``: an evaluation's ``--raport-file`` of the user's
        choosing, which must not exist (see :meth:`claim_evaluation_raport`); ``gathering``: the run keeps
        per-epoch files (``--gather-checkpoints``), whose names must be free for files too."""
        self.check_names(saving)
        try:
            self._check_writable(saving)
            if saving:
                self._check_copies_free(gathering)
        except OSError as error:  # a path too long for the file system, say
            raise self._cannot_write(error) from None
        if raport_must_be_new and self.raport.exists():
            raise UserError(f"--raport-file {self.raport} already holds records: an evaluation writes a raport of "
                            "its own, never into another one; give another --raport-file, or move that file away")
        self._check_own_files(locking)
        if locking:
            self._check_not_in_use()

    def _check_own_files(self, locking: bool) -> None:
        """A link, a FIFO or anything but a regular file where the run writes in place (the raport, and the lock
        when it takes it): written through, a link would change a file outside the workspace; a FIFO's open
        would wait for good, the workspace taken and a SIGTERM unanswered."""
        for path, what in ((self.raport, "--raport-file"), *(((self.path / LOCK_NAME, "the workspace's lock"),)
                                                             if locking else ())):
            problem = own_file_problem(path)
            if problem is not None:
                raise self._not_own(path, what, problem)

    @staticmethod
    def _not_own(path: Path, what: str, problem: str) -> UserError:
        return UserError(f"{path} {problem}, where a run writes {what} as a regular file of its own; remove it")

    def _check_writable(self, saving: bool) -> None:
        """A workspace that is a file or lies below one, a file name whose folder is a file or whose place a
        folder takes, a workspace (or the folder it would be made in) that cannot be written."""
        problem = folder_problem(self.path)
        if problem is not None:
            raise UserError(f"{self.named} {problem}")
        for name in (self.raport_file,) + ((self.checkpoint_filename,) if saving else ()):
            target = self.path / name
            holder = nearest_existing(target.parent)
            if not holder.is_dir():
                raise UserError(f"{holder} is a file, so {name} cannot be written inside --workspace")
            if target.is_dir():
                raise UserError(f"{target} is a folder; it must be free for a file")

    def _check_copies_free(self, gathering: bool) -> None:
        """A folder named like the best model or (``gathering``) a per-epoch file: the copy's rename would fail
        at the end of every epoch (EISDIR), and pruning would fail to delete it."""
        taken = [self.best] if self.best.is_dir() else []
        if gathering and self.path.is_dir():
            taken += [entry for entry in sorted(self.path.iterdir())
                      if is_epoch_checkpoint_name(entry.name) and entry.is_dir()]
        if taken:
            what = "the best model" if taken[0] == self.best else "a per-epoch checkpoint (--gather-checkpoints)"
            raise UserError(f"{taken[0]} is a folder, where the run writes {what} as a file; remove it or move "
                            "it away")

    def _check_not_in_use(self) -> None:
        """Refuse a workspace whose lock another live run holds, as :meth:`lock` would, without taking it.

        Done under the folder's flock that :meth:`lock` takes too, so that the probe never makes a run
        that is taking the lock at that moment fail."""
        path = self.path / LOCK_NAME
        if fcntl is None or not path.is_file():
            return
        try:
            guard = os.open(self.path, os.O_RDONLY)
        except OSError:
            return  # prepare() says what is wrong with the folder
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            with open_own(path, "r", encoding="utf-8") as handle:
                if try_flock(handle, fcntl.LOCK_SH) is False and not _recorded_holder_is_dead(path):
                    raise self._in_use(path)
        except OSError:
            return  # a file system without locks, or a lock file that cannot be read: lock() decides
        finally:
            os.close(guard)

    def prepare(self, saving: bool) -> None:
        """Create the workspace (and the folders its file names hold) and prove it writable; what :meth:`check`
        finds is refused first, and anything else that stops the writing is a :class:`UserError` too."""
        self.check(saving, locking=False)
        names = (self.raport_file,) + ((self.checkpoint_filename,) if saving else ())
        try:
            for name in names:
                (self.path / name).parent.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".write-test.", suffix=TEMP_SUFFIX, dir=self.path)
            os.close(fd)
            os.unlink(probe)
        except OSError as error:
            raise self._cannot_write(error) from None

    def _cannot_write(self, error: OSError) -> UserError:
        if error.errno == errno.ENAMETOOLONG:
            return UserError(f"{self.named} with --checkpoint-filename / --raport-file makes a path too "
                             "long for the file system; choose shorter names")
        reason = "it is read-only" if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM) else \
            (error.strerror or str(error))
        return UserError(f"{self.named} cannot be written: {reason}")

    # -- lock ---------------------------------------------------------------------------------------
    def lock(self) -> None:
        """Take the workspace for this run, or stop with a :class:`UserError` naming the run that has it.

        Starting runs take turns (a flock on the workspace folder, held for the moment this takes), so
        that two of them never both take over the lock of a dead run.
        """
        if fcntl is None or self._lock_handle is not None:
            return
        path = self.path / LOCK_NAME
        guard = os.open(self.path, os.O_RDONLY)
        try:
            try:
                fcntl.flock(guard, fcntl.LOCK_EX)
            except OSError:
                return  # a file system without locks (some network mounts): run unlocked
            handle = self._open_lock(path)
            locked = try_flock(handle)
            if locked is False and _recorded_holder_is_dead(path):
                handle.close()
                path.unlink()  # the dead run's children keep the old file locked; a new file is free
                handle = self._open_lock(path)
                locked = try_flock(handle)
            if not locked:
                handle.close()
                if locked is None:
                    return  # a file system without locks: run unlocked
                raise self._in_use(path)
            handle.seek(0)
            handle.truncate()
            started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
            handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {started}\n"
                         f"{json.dumps(_holder_record())}\n")
            handle.flush()  # nothing left in the buffer for a fork child to write again
            _HELD.append(handle)
            self._lock_handle = handle
        finally:
            os.close(guard)

    def _open_lock(self, path: Path) -> TextIO:
        try:
            return open_own(path, "a+", encoding="utf-8")
        except OSError as error:
            problem = refused_own_file(path, error)
            if problem is not None:
                raise self._not_own(path, "the workspace's lock", problem) from None
            raise self._cannot_write(error) from None

    def _in_use(self, path: Path) -> UserError:
        try:
            holder = read_regular(path, MAX_LOCK_RECORD_BYTES).decode("utf-8", "replace").splitlines()[0].strip()
        except (OSError, IndexError, ValueError):
            holder = "another process"
        return UserError(f"{self.named} is in use by another run ({holder}); wait for it to end "
                         "or choose another --workspace")

    def unlock(self) -> None:
        if self._lock_handle is not None:
            self._lock_handle.close()  # closing the file releases the flock
            if self._lock_handle in _HELD:
                _HELD.remove(self._lock_handle)
            self._lock_handle = None

    def __enter__(self) -> "Workspace":
        self.lock()
        return self

    def __exit__(self, *exc) -> None:
        self.unlock()

    # -- files ----------------------------------------------------------------------------------------
    def remove_stale_temporaries(self) -> list[Path]:
        """Delete what a killed save left behind (only checkpoint temporaries; call with the lock held)."""
        removed = []
        latest = temporary_name(self.latest)  # cut for a long name
        for entry in self.path.iterdir():
            match = _TEMPORARY.match(entry.name)
            ours = match and (entry.name.startswith(latest) or self._is_checkpoint_name(match["name"]))
            if ours and entry.is_file():
                entry.unlink(missing_ok=True)
                removed.append(entry)
        return removed

    def claim_evaluation_raport(self) -> Path:
        """The raport file of an evaluation, created here: ``--raport-file`` when no such file exists, else a
        new file beside it named by the time, ``<stem>.evaluate-<YYYYmmdd-HHMMSS>[-N]<suffix>``.

        An evaluation's records never go into a raport that holds another run's or evaluation's: appended,
        they would read as one run; a resume's offset would even cut the training records after it.  The
        file is created exclusively, so two evaluations starting at once never share one either.  A name the
        user chose is never replaced by another (a script would read the earlier file's numbers as this
        run's): :meth:`check` refuses it when it exists.
        """
        wanted = self.raport
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        stem, suffix = (wanted.stem, wanted.suffix) if wanted.suffix else (wanted.name, "")
        names = [wanted.name] + [f"{stem}.evaluate-{stamp}{'' if n == 1 else f'-{n}'}{suffix}"
                                 for n in range(1, 100)]
        try:
            for name in names:
                try:
                    with open_own(wanted.with_name(name), "x", encoding="utf-8"):
                        pass
                except FileExistsError:
                    continue
                self.raport_file = str(Path(self.raport_file).with_name(name))
                return self.raport
        except OSError as error:
            raise StorageError(f"could not create the raport of this evaluation beside {wanted}: "
                               f"{error.strerror or error}") from None
        raise StorageError(f"could not find a free name for the raport of this evaluation beside {wanted}")

    def copies(self, progress: Mapping, gathering: bool) -> list[Path]:
        """The files a save at ``progress`` (a checkpoint's ``epoch``, ``batch`` and ``best_epoch``) writes after
        the latest checkpoint, as copies of it: at the end of an epoch its per-epoch file (``gathering``:
        ``--gather-checkpoints``), and the best model when that epoch is the best; none mid-epoch."""
        epoch, batch, best = int(progress["epoch"]), int(progress.get("batch", 0)), progress.get("best_epoch", -1)
        if batch or epoch < 1:
            return []
        return ([self.path / epoch_checkpoint_name(epoch - 1)] if gathering else []) + \
            ([self.best] if best == epoch - 1 else [])

    def owed_copies(self, latest: Mapping, gathering: bool) -> list[Path]:
        """The :meth:`copies` of the latest checkpoint (``latest``: what it holds) that do not hold its bytes: its
        save stopped before them (a kill, a full disk, a folder in their place)."""
        return [target for target in self.copies(latest, gathering)
                if not (target.is_file() and filecmp.cmp(self.latest, target, shallow=False))]

    def write_copies(self, targets: list[Path], keep_epochs: int) -> None:
        """Copy the latest checkpoint to ``targets`` (:meth:`copies`), then keep the newest ``keep_epochs``
        per-epoch files (``--gather-checkpoints``: all when -1, none written when 0)."""
        for target in targets:
            copy_atomic(self.latest, target)
        if keep_epochs != 0:
            prune_epoch_checkpoints(self.path, keep_epochs)

    def write_owed_copies(self, source: str | os.PathLike | None, latest: Mapping, keep_epochs: int, log) -> None:
        """Before a run resumed from ``source`` saves anything: when that is the latest checkpoint (``latest``:
        what it holds), write the copies its save did not (:meth:`owed_copies`), said in one line."""
        if source is None or not self.latest.is_file() or not os.path.samefile(source, self.latest):
            return
        owed = self.owed_copies(latest, keep_epochs != 0)
        if owed:
            log(f"=> writing {' and '.join(target.name for target in owed)} from {self.latest}: the save of "
                f"{position_text(int(latest['epoch']))} ended before them")
            self.write_copies(owed, keep_epochs)

    @staticmethod
    def _is_checkpoint_name(name: str) -> bool:
        return name == BEST_NAME or is_epoch_checkpoint_name(name) or name.endswith(".pth.tar")

    def resume_candidates(self) -> list[Path]:
        """Checkpoints ``--resume auto`` may continue from, in the order that wins a tie of the progress they
        record: the latest file, the per-epoch files (the last epoch first), the best; none in a workspace not
        made yet (a run reads it before it creates it).  Their times say nothing: a copy made file by file
        (cp, a download) gives them the order of the copy."""
        if not self.path.is_dir():
            return []
        files = [self.latest, *reversed(epoch_checkpoints(self.path)), self.best]
        return [f for f in dict.fromkeys(files) if f.is_file()]

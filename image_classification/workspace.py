"""The workspace a run writes into: checked before the first step, locked while the run lives.

* :meth:`Workspace.prepare` refuses, with one line each and before anything is written, a workspace that
  is a file or cannot be written, and a ``--checkpoint-filename`` / ``--raport-file`` that is empty, too
  long for the file system, outside the workspace, or the same file as a checkpoint, the lock or each other;
* :meth:`Workspace.lock` holds an exclusive ``flock`` on ``.workspace.lock``: a second run on the same
  workspace stops with the first one's pid and host; the kernel drops the lock when its process dies,
  so a killed run never blocks the next one;
* temporary files left by a killed save are removed once the lock is held;
* :meth:`Workspace.resume_candidates` lists the checkpoints ``--resume auto`` may continue from.
"""

from __future__ import annotations

import datetime
import errno
import os
import re
import socket
import tempfile
from pathlib import Path

from .checkpoint import (BEST_NAME, TEMP_SUFFIX, epoch_checkpoints, is_epoch_checkpoint_name, longest_name,
                         temporary_name)
from .errors import UserError

LOCK_NAME = ".workspace.lock"
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]+" + re.escape(TEMP_SUFFIX) + "$")

try:
    import fcntl
except ImportError:  # not POSIX: no locking, every other check still applies
    fcntl = None


class Workspace:
    def __init__(self, path: str | os.PathLike, checkpoint_filename: str, raport_file: str):
        self.path = Path(path)
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

    def prepare(self, saving: bool) -> None:
        """Create the workspace and prove it writable; :class:`UserError` (before any training) if not."""
        self.check_names(saving)
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"--workspace {self.path} is a file, not a folder")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            for name in (self.raport_file, self.checkpoint_filename):
                parent = (self.path / name).parent
                if parent.exists() and not parent.is_dir():
                    raise UserError(f"{parent} is a file, so {name} cannot be written inside --workspace")
                parent.mkdir(parents=True, exist_ok=True)
            for target in (self.raport, self.latest):
                if target.is_dir():
                    raise UserError(f"{target} is a folder; it must be free for a file")
            fd, probe = tempfile.mkstemp(prefix=".write-test.", suffix=TEMP_SUFFIX, dir=self.path)
            os.close(fd)
            os.unlink(probe)
        except OSError as error:
            if error.errno == errno.ENAMETOOLONG:
                raise UserError(f"--workspace {self.path} with --checkpoint-filename / --raport-file makes a "
                                "path too long for the file system; choose shorter names") from None
            reason = "it is read-only" if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM) else \
                (error.strerror or str(error))
            raise UserError(f"--workspace {self.path} cannot be written: {reason}") from None

    # -- lock ---------------------------------------------------------------------------------------
    def lock(self) -> None:
        """Take the workspace for this run, or stop with a :class:`UserError` naming the run that has it."""
        if fcntl is None or self._lock_handle is not None:
            return
        path = self.path / LOCK_NAME
        handle = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                handle.close()
                return  # a file system without locks (some network mounts): run unlocked
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise UserError(f"--workspace {self.path} is in use by another run ({holder}); wait for it to end "
                            "or choose another --workspace") from None
        handle.seek(0)
        handle.truncate()
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {started}\n")
        handle.flush()
        self._lock_handle = handle

    def unlock(self) -> None:
        if self._lock_handle is not None:
            self._lock_handle.close()  # closing the file releases the flock
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

    @staticmethod
    def _is_checkpoint_name(name: str) -> bool:
        return name == BEST_NAME or is_epoch_checkpoint_name(name) or name.endswith(".pth.tar")

    def resume_candidates(self) -> list[Path]:
        """Checkpoints ``--resume auto`` may continue from, newest first (the latest file wins a tie)."""
        files = [self.latest, *reversed(epoch_checkpoints(self.path)), self.best]
        existing = [f for f in dict.fromkeys(files) if f.is_file()]
        order = {path: index for index, path in enumerate(existing)}
        return sorted(existing, key=lambda p: (-p.stat().st_mtime_ns, order[p]))

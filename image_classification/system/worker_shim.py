"""The first moments of a ``multiproc.py`` worker: ``python -u worker_shim.py LOG_DIR SCRIPT ARGS``.

torchrun starts this file by path for every process; it points local rank k > 0's output at
``LOG_DIR/GPU_k.log`` and then becomes the training script.  Standard library only, and no imports from
the package: it runs before (and instead of) anything heavy.
"""

import os
import sys

WORKER_LOG = "GPU_{}.log"


def exec_worker(argv: list[str]) -> None:
    """Redirect local rank k > 0's stdout and stderr, then ``exec`` the script (same pid, so torchrun's
    monitoring and signals reach the training script).

    The log is the empty regular file multiproc.py made (``multiproc.prepare_logs``), appended to: a restarted
    process (multiproc.py --max-restarts) writes after its predecessor's last words, which say why.  It is never
    opened through a link, nor waiting on a FIFO put in its place since (made again where it went)."""
    log_dir, script, *args = argv
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank > 0:
        path = os.path.join(log_dir, WORKER_LOG.format(local_rank))
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        log = os.open(path, flags, 0o644)
        os.set_blocking(log, True)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
    os.execv(sys.executable, [sys.executable, "-u", script, *args])


if __name__ == "__main__":
    exec_worker(sys.argv[1:])

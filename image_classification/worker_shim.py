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
    monitoring and signals reach the training script)."""
    log_dir, script, *args = argv
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank > 0:
        path = os.path.join(log_dir, WORKER_LOG.format(local_rank))
        # a restarted process (multiproc.py --max-restarts) adds to its predecessor's log, whose end says why
        restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
        log = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if restarted else os.O_TRUNC), 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
    os.execv(sys.executable, [sys.executable, "-u", script, *args])


if __name__ == "__main__":
    exec_worker(sys.argv[1:])

"""``multiproc.py``: one training process per GPU, started and supervised by torchrun's engine.

``python multiproc.py --nproc_per_node 8 main.py ARGS`` keeps the reference's flags.  Every worker
gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; local rank 0
writes to the terminal and local rank k > 0 to ``GPU_k.log`` (in ``--log_dir``, the current
directory by default).  When any worker fails, torchrun stops the others and multiproc exits 1.

This module also holds the rendezvous helpers for jobs started by SLURM's ``srun``.  It imports
nothing but the standard library at the top: torchrun runs this very file as the small shim that
points a worker's output at its log file before it becomes the training script.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Mapping, Sequence

WORKER_LOG = "GPU_{}.log"
DEFAULT_SLURM_PORT = 29500


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        from .errors import UserError

        raise UserError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="multiproc.py",
        description="Start --nproc_per_node copies of a training script on this node (torchrun's engine, "
        "static rendezvous at --master_addr:--master_port).",
        epilog="Local rank 0 writes to the terminal; local rank k > 0 writes to GPU_k.log in --log_dir. "
        "If any process fails, the others are stopped and multiproc.py exits 1.",
    )
    parser.add_argument("--nnodes", metavar="N", type=int, default=1, help="number of nodes (default: 1)")
    parser.add_argument("--node_rank", "--node-rank", metavar="R", type=int, default=0,
                        help="rank of this node, 0 to nnodes-1 (default: 0)")
    parser.add_argument("--nproc_per_node", "--nproc-per-node", metavar="N", type=int, default=1,
                        help="processes on this node, usually one per GPU (default: 1)")
    parser.add_argument("--master_addr", "--master-addr", metavar="HOST", default="127.0.0.1",
                        help="address of the node with node_rank 0 (default: 127.0.0.1)")
    parser.add_argument("--master_port", "--master-port", metavar="PORT", type=int, default=29500,
                        help="a free port on the master node (default: 29500)")
    parser.add_argument("--log_dir", "--log-dir", metavar="DIR", default=".",
                        help="folder of the GPU_k.log files of local ranks k > 0 (default: .)")
    parser.add_argument("training_script", help="the script every process runs: ./main.py or ./launch.py")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="its arguments")
    return parser


def check(ns: argparse.Namespace) -> None:
    from .errors import UserError

    if ns.nnodes < 1 or ns.nproc_per_node < 1:
        raise UserError("--nnodes and --nproc_per_node must be at least 1")
    if not 0 <= ns.node_rank < ns.nnodes:
        raise UserError(f"--node_rank must be between 0 and --nnodes - 1 = {ns.nnodes - 1}, "
                        f"got {ns.node_rank}")
    if not 0 < ns.master_port < 65536:
        raise UserError(f"--master_port must be a port number, got {ns.master_port}")
    if not os.path.isfile(ns.training_script):
        raise UserError(f"no such training script: {ns.training_script}")


def torchrun_argv(ns: argparse.Namespace) -> list[str]:
    """torchrun's arguments for a run: static rendezvous, no restarts, workers through the log shim."""
    log_dir = os.path.abspath(ns.log_dir)
    return [
        "--nnodes", str(ns.nnodes),
        "--node-rank", str(ns.node_rank),
        "--nproc-per-node", str(ns.nproc_per_node),
        "--master-addr", ns.master_addr,
        "--master-port", str(ns.master_port),
        "--rdzv-backend", "static",
        "--max-restarts", "0",
        "--monitor-interval", "0.5",
        os.path.abspath(__file__), log_dir, ns.training_script, *ns.training_script_args,
    ]


def _describe_exit(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the workers; 0 when all of them succeed, 1 when one fails."""
    ns = build_parser().parse_args(argv)
    check(ns)
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    Path(ns.log_dir).mkdir(parents=True, exist_ok=True)
    if "OMP_NUM_THREADS" not in os.environ:  # share the cores instead of oversubscribing them
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        os.environ["OMP_NUM_THREADS"] = str(max(1, cpus // ns.nproc_per_node))
    command = shlex.join([sys.executable, "-u", ns.training_script, *ns.training_script_args])
    first, last = ns.nproc_per_node * ns.node_rank, ns.nproc_per_node * (ns.node_rank + 1) - 1
    print(f"multiproc.py: node {ns.node_rank} of {ns.nnodes} starts ranks {first}-{last} "
          f"(master {ns.master_addr}:{ns.master_port}): {command}", flush=True)
    if ns.nproc_per_node > 1:
        print(f"multiproc.py: local ranks 1-{ns.nproc_per_node - 1} write to "
              f"{os.path.join(ns.log_dir, WORKER_LOG.format('k'))}", flush=True)
    try:
        torchrun.run(torchrun.parse_args(torchrun_argv(ns)))
    except ChildFailedError as failed:
        # the root cause: not one of the processes torchrun itself stopped with SIGTERM, the earliest
        rank, failure = min(failed.failures.items(),
                            key=lambda item: (item[1].exitcode == -signal.SIGTERM, item[1].timestamp, item[0]))
        where = "" if failure.local_rank == 0 else \
            f"; see {os.path.join(ns.log_dir, WORKER_LOG.format(failure.local_rank))}"
        print(f"multiproc.py: rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) "
              f"{_describe_exit(failure.exitcode)}{where}; the other processes were stopped",
              file=sys.stderr, flush=True)
        return 1
    except SignalException as stopped:
        print(f"multiproc.py: stopped by {signal.Signals(stopped.sigval).name}", file=sys.stderr, flush=True)
        return 128 + int(stopped.sigval)
    return 0


# ------------------------------------------------------------------------------------------------
# The worker shim (this file run by path: ``python -u multiproc.py LOG_DIR SCRIPT ARGS``)
# ------------------------------------------------------------------------------------------------
def exec_worker(argv: Sequence[str]) -> None:
    """Point local rank k > 0's stdout and stderr at LOG_DIR/GPU_k.log, then become the script.

    ``exec`` keeps the process id, so torchrun's monitoring and signals reach the training script.
    """
    log_dir, script, *args = argv
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank > 0:
        path = os.path.join(log_dir, WORKER_LOG.format(local_rank))
        log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
    os.execv(sys.executable, [sys.executable, "-u", script, *args])


# ------------------------------------------------------------------------------------------------
# SLURM
# ------------------------------------------------------------------------------------------------
def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets: ``a[1-2,5],b`` -> ``['a[1-2,5]', 'b']``."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


def first_host(nodelist: str) -> str:
    """The first host of a SLURM hostlist, expanded without ``scontrol``.

    ``node[01-04],other`` -> ``node01``; ``rack[1-2]-gpu[3,5]`` -> ``rack1-gpu3``; ``host`` -> ``host``.
    """
    entries = _split_top_level(nodelist)
    if not entries:
        raise ValueError("empty SLURM node list")
    host, rest = [], entries[0]
    while "[" in rest:
        prefix, _, after = rest.partition("[")
        ranges, closing, rest = after.partition("]")
        if not closing:
            raise ValueError(f"unbalanced brackets in SLURM node list {nodelist!r}")
        first_range = ranges.split(",")[0].strip()
        host += [prefix, first_range.split("-")[0]]  # "01-04" -> "01", keeping the zero padding
    host.append(rest)
    return "".join(host)


def slurm_rendezvous_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``MASTER_ADDR`` and ``MASTER_PORT`` for a job step started by ``srun``; {} outside one.

    The address is the step's first node (``SLURM_STEP_NODELIST``, else ``SLURM_JOB_NODELIST``); the
    port is 29500, or ``MASTER_PORT`` when the user exported one.  Values already in the environment
    are returned unchanged, so an explicit ``MASTER_ADDR`` wins.
    """
    environ = os.environ if environ is None else environ
    nodelist = next((environ[key] for key in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                     if environ.get(key)), None)
    if "SLURM_PROCID" not in environ or not nodelist:
        return {}
    return {
        "MASTER_ADDR": environ.get("MASTER_ADDR") or first_host(nodelist),
        "MASTER_PORT": environ.get("MASTER_PORT") or str(DEFAULT_SLURM_PORT),
    }


if __name__ == "__main__":
    exec_worker(sys.argv[1:])

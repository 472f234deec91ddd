"""``multiproc.py``: one training process per GPU, started and supervised by torchrun's engine.

``python multiproc.py --nproc_per_node 8 main.py ARGS`` keeps the reference's flags.  Every worker
gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; local rank 0
writes to the terminal and local rank k > 0 to ``GPU_k.log`` (in ``--log_dir``, the current
directory by default); after a successful run the logs that stayed empty are removed.  When any worker
fails, torchrun stops the others and multiproc exits 1 with one line naming the failed rank (torch's
own log lines about it are held back: they say the same).  Workers that stopped early after saving a
checkpoint (exit 75, on SIGTERM, SIGUSR1 or Ctrl-C) make multiproc exit 75 as well; a SIGTERM, SIGUSR1 or
SIGINT (Ctrl-C) sent to multiproc itself is passed on to the workers, which torchrun starts in sessions of
their own, out of the terminal's reach; a second Ctrl-C stops them at once, without saving (exit 130).

It imports torch only when it starts the workers, so ``-h`` and its errors are immediate; each worker
starts as :mod:`image_classification.system.worker_shim`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import shutil
import signal
import sys
import sysconfig
from pathlib import Path
from typing import Iterator, Sequence

from .errors import EXIT_PREEMPTED, PeerLost, UserError, write_failure
from .records.datafile import open_own, refused_own_file
from .system import worker_shim
from .system.cli import UserErrorParser, whole_number
from .system.machine import cores
from .system.worker_shim import WORKER_LOG

# torch.distributed.elastic's log lines that multiproc's own messages replace (matched on the template)
ELASTIC_LOGGER = "torch.distributed.elastic.multiprocessing.api"
ELASTIC_REPEATS = ("failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s",
                   "Sending process %s closing signal %s")
# torch elastic's agent says at INFO level (not shown) that it restarts the workers: multiproc says it
AGENT_LOGGER = "torch.distributed.elastic.agent.server.api"
RELAYED_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")  # passed on to the workers, which save and stop (exit 75)
INTERRUPTED = 130  # a worker's exit code after a second Ctrl-C (128 + SIGINT), as a shell reports it


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(
        prog="multiproc.py",
        description="Start --nproc_per_node copies of a training script on this node (torchrun's engine, "
        "static rendezvous at --master_addr:--master_port).",
        epilog="Local rank 0 writes to the terminal; local rank k > 0 writes to GPU_k.log in --log_dir "
        "(a log left empty is removed after a successful run). If any process fails, the others are "
        "stopped and multiproc.py exits 1; when they stop early after saving a checkpoint (SIGTERM, "
        "SIGUSR1, Ctrl-C), it exits 75.",
    )
    parser.add_argument("--nnodes", metavar="N", type=whole_number, default=1, help="number of nodes (default: 1)")
    parser.add_argument("--node_rank", "--node-rank", metavar="R", type=whole_number, default=0,
                        help="rank of this node, 0 to nnodes-1 (default: 0)")
    parser.add_argument("--nproc_per_node", "--nproc-per-node", metavar="N", type=whole_number, default=1,
                        help="processes on this node, usually one per GPU (default: 1)")
    parser.add_argument("--master_addr", "--master-addr", metavar="HOST", default="127.0.0.1",
                        help="address of the node with node_rank 0 (default: 127.0.0.1)")
    parser.add_argument("--master_port", "--master-port", metavar="PORT", type=whole_number, default=29500,
                        help="a free port on the master node (default: 29500)")
    parser.add_argument("--max-restarts", "--max_restarts", metavar="N", type=whole_number, default=0,
                        help="restart every process of this node up to N times when one fails; with "
                        "--resume auto and --checkpoint-interval the run continues where it was (default: 0)")
    parser.add_argument("--rdzv-backend", "--rdzv_backend", choices=("static", "c10d"), default="static",
                        help="how nodes meet: static (node ranks fixed by --node_rank, the reference's) or "
                        "c10d (at --rdzv-endpoint, in any order) (default: static)")
    parser.add_argument("--rdzv-endpoint", "--rdzv_endpoint", metavar="HOST:PORT", default=None,
                        help="c10d's meeting point (default: --master_addr:--master_port)")
    parser.add_argument("--rdzv-id", "--rdzv_id", metavar="ID", default="image-classification",
                        help="c10d's job id, the same on every node (default: image-classification)")
    parser.add_argument("--log_dir", "--log-dir", metavar="DIR", default=".",
                        help="folder of the GPU_k.log files of local ranks k > 0 (default: .)")
    parser.add_argument("training_script",
                        help="the script every process runs: ./main.py or ./launch.py, or an installed "
                        "command such as ic-train or ic-launch")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="its arguments")
    return parser


def check(ns: argparse.Namespace) -> None:
    if ns.nnodes < 1 or ns.nproc_per_node < 1:
        raise UserError("--nnodes and --nproc_per_node must be at least 1")
    if not 0 <= ns.node_rank < ns.nnodes:
        raise UserError(f"--node_rank must be between 0 and --nnodes - 1 = {ns.nnodes - 1}, "
                        f"got {ns.node_rank}")
    if ns.max_restarts < 0:
        raise UserError(f"--max-restarts must be 0 or more, got {ns.max_restarts}")
    if not 0 < ns.master_port < 65536:
        raise UserError(f"--master_port must be a port number, got {ns.master_port}")


def script_path(script: str) -> str:
    """The file the workers run: ``script`` itself, else the command of that name on PATH or beside
    this Python (an unactivated venv's ``bin/``).

    Installed console commands (``ic-train``, ``ic-launch``) are Python scripts, so ``python -u`` runs them.
    """
    if os.path.isfile(script):
        return script
    found = shutil.which(script) or shutil.which(script, path=sysconfig.get_path("scripts"))
    if found is None:
        raise UserError(f"no such training script: {script}")
    return found


REPO_SCRIPTS = {Path(__file__).resolve().parents[1] / name: name for name in ("main.py", "launch.py")}
COMMANDS = {"ic-train": "main.py", "ic-launch": "launch.py"}  # the installed commands that run them


def training_arguments(script: str, argv: Sequence[str]) -> argparse.Namespace | None:
    """The main.py arguments that ``script argv`` would run with, when ``script`` is this toolkit's main.py or
    launch.py (or ic-train, ic-launch); None for another script, and for a command that trains nothing
    (``-h``, launch.py's ``--list`` and ``--dry-run``), whose output is the processes' to give."""
    kind = REPO_SCRIPTS.get(Path(script).resolve()) or COMMANDS.get(Path(script).name)
    if kind is None or any(token in ("-h", "--help") for token in argv):
        return None
    prog = Path(script).name
    if kind == "launch.py":
        from .launch import run_arguments  # deferred: PyYAML and the presets, for launch.py's runs

        return run_arguments(argv, prog=prog)
    from .arguments import parse_args  # deferred: main.py's parser, for a training command (not -h)

    return parse_args(argv, prog=prog)


def check_before_starting(ns: argparse.Namespace) -> None:
    """Refuse a training command that every process would refuse at once (a flag, no dataset, a workspace that
    holds another run), before any starts or a log is written: one line and exit 2, instead of each process
    failing on its own after seconds of imports, multiproc exiting 1 and GPU_k.log files left behind.

    The workspace is checked on the node that will hold rank 0 only (node 0 of a static rendezvous): on
    another node, rank 0 may already be writing into it."""
    args = training_arguments(ns.training_script, ns.training_script_args)
    if args is None:
        return
    from .train.startup import preflight  # deferred: numpy and PIL, once the command line is checked

    on_rank_0s_node = ns.nnodes == 1 or (ns.rdzv_backend == "static" and ns.node_rank == 0)
    preflight(args, workspace=on_rank_0s_node, earlier_run=on_rank_0s_node)


def torchrun_argv(ns: argparse.Namespace) -> list[str]:
    """torchrun's arguments for a run: the rendezvous, the restarts, the workers through the log shim.

    The static rendezvous (the reference's) fixes each node's rank; c10d lets nodes meet at
    ``--rdzv-endpoint`` in any order, which a restarted job on a scheduler needs.
    """
    log_dir = os.path.abspath(ns.log_dir)
    if ns.rdzv_backend == "static":
        rendezvous = ["--node-rank", str(ns.node_rank), "--master-addr", ns.master_addr,
                      "--master-port", str(ns.master_port), "--rdzv-backend", "static"]
    else:
        endpoint = ns.rdzv_endpoint or f"{ns.master_addr}:{ns.master_port}"
        rendezvous = ["--rdzv-backend", ns.rdzv_backend, "--rdzv-endpoint", endpoint, "--rdzv-id", ns.rdzv_id]
    return [
        "--nnodes", str(ns.nnodes),
        "--nproc-per-node", str(ns.nproc_per_node),
        *rendezvous,
        "--max-restarts", str(ns.max_restarts),
        "--monitor-interval", "0.5",
        os.path.abspath(worker_shim.__file__), log_dir, ns.training_script, *ns.training_script_args,
    ]


def _ranks(first: int, last: int) -> str:
    return f"rank {first}" if first == last else f"ranks {first}-{last}"


def startup_lines(ns: argparse.Namespace, command: str) -> list[str]:
    """What multiproc says before the workers start: which ranks run what, and where their output goes."""
    first = ns.nproc_per_node * ns.node_rank
    last = first + ns.nproc_per_node - 1
    node = f"node {ns.node_rank} of {ns.nnodes} " if ns.nnodes > 1 else ""
    lines = [f"multiproc.py: {node}starts {_ranks(first, last)} (master {ns.master_addr}:{ns.master_port}): "
             f"{command}"]
    if ns.nproc_per_node == 2:
        log = os.path.join(ns.log_dir, WORKER_LOG.format(1))
        lines.append(f"multiproc.py: rank {first + 1} writes to {log}")
    elif ns.nproc_per_node > 2:
        logs = f"{WORKER_LOG.format(1)} ... {WORKER_LOG.format(ns.nproc_per_node - 1)}"
        lines.append(f"multiproc.py: {_ranks(first + 1, last)} write to {logs} in {ns.log_dir}")
    return lines


def _not_a_repeat(record: logging.LogRecord) -> bool:
    """A logging filter: False for torch elastic's records that multiproc's own messages repeat."""
    return record.msg not in ELASTIC_REPEATS


def _restart_notice(record: logging.LogRecord) -> bool:
    """A logging filter for the agent's records: the restart of the workers said in one line of our own,
    the agent's other records shown from WARNING up as they were."""
    if "attempts left" in str(record.msg) and isinstance(record.args, tuple) and len(record.args) == 4:
        left, most = record.args[2:]
        print(f"multiproc.py: a process failed; restarting the processes of this node (restart "
              f"{most - left + 1} of --max-restarts {most}); --resume auto continues from the last "
              "checkpoint", file=sys.stderr, flush=True)
        return False
    return record.levelno >= logging.WARNING


def prepare_logs(log_dir: str, nproc_per_node: int) -> None:
    """Make ``log_dir`` and an empty ``GPU_k.log`` there for each local rank k > 0, which its process then appends
    to (a restarted one after its predecessor's last words), before any starts: a log_dir that cannot be
    written is one line (exit 2 read-only, 4 full) instead of a traceback in each process, and a link, a FIFO or
    a folder named like a log is refused with exit 2 (written through, a link would change a file outside
    log_dir; a FIFO's open would hang the job)."""
    try:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        for local_rank in range(1, nproc_per_node):
            path = Path(log_dir, WORKER_LOG.format(local_rank))
            try:
                open_own(path, "wb").close()
            except OSError as error:
                problem = refused_own_file(path, error)
                if problem is not None:
                    raise UserError(f"{path} {problem}, where multiproc.py writes local rank {local_rank}'s output as "
                                    "a regular file of its own; remove it, or choose another --log_dir") from None
                raise
    except OSError as error:
        raise write_failure(f"--log_dir {log_dir}", error) from None


def remove_empty_logs(log_dir: str, nproc_per_node: int) -> None:
    """Delete the GPU_k.log files that stayed empty; the others hold what those ranks printed."""
    for local_rank in range(1, nproc_per_node):
        path = Path(log_dir, WORKER_LOG.format(local_rank))
        if path.is_file() and path.stat().st_size == 0:
            path.unlink()


def _describe_exit(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _child_pids() -> list[int]:
    """The processes this one started (on Linux, from /proc; elsewhere none)."""
    own, children = os.getpid(), []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == own:  # the field after the state is the parent's pid
            children.append(int(entry.name))
    return children


def _relay_to_workers(signum: int, frame) -> None:
    """Pass a SIGTERM, SIGUSR1 (SLURM's time limit, its warning before a preemption) or SIGINT (Ctrl-C) on to
    the workers, which save and exit 75; torchrun then reports them, and multiproc exits 75 as they did."""
    for pid in _child_pids():
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _has_signals_option(torchrun) -> bool:
    """Whether torchrun takes ``--signals-to-handle`` (torch 2.9 on), so that SIGTERM can be left to us."""
    options = (action.option_strings for action in torchrun.get_args_parser()._actions)
    return any("--signals-to-handle" in strings for strings in options)


@contextlib.contextmanager
def _sigterm_stays_ours() -> Iterator[None]:
    """A torch without torchrun's ``--signals-to-handle`` (before 2.9) takes SIGTERM for itself each time it
    starts the workers: it would exit 143 and kill a worker still saving after 30 s.  Take it back then."""
    from torch.distributed.elastic.multiprocessing.api import PContext

    start = PContext.start

    def start_then_take_sigterm_back(self) -> None:
        start(self)
        for name in RELAYED_SIGNALS:
            if name != "SIGUSR1":  # torch leaves it alone
                signal.signal(getattr(signal, name), _relay_to_workers)

    PContext.start = start_then_take_sigterm_back
    try:
        yield
    finally:
        PContext.start = start


def _stopped_early(failures) -> bool:
    """Whether the workers stopped on a SIGTERM / SIGUSR1 / SIGINT after saving (exit 75), rather than failed.

    The first to exit makes torchrun stop the others with SIGTERM; those count as stopped too.
    """
    codes = [failure.exitcode for failure in failures]
    return EXIT_PREEMPTED in codes and all(code in (EXIT_PREEMPTED, -signal.SIGTERM) for code in codes)


def _interrupted(failures) -> bool:
    """Whether the workers were stopped at once by a second Ctrl-C (exit 130), the others by torchrun."""
    codes = [failure.exitcode for failure in failures]
    return INTERRUPTED in codes and all(code in (INTERRUPTED, EXIT_PREEMPTED, -signal.SIGTERM) for code in codes)


def _root_cause_first(item) -> tuple:
    """Order failed processes so the cause comes first: not one that torchrun itself stopped with SIGTERM,
    nor one that stopped because a peer was gone (exit 5), then the earliest (timestamps are in seconds)."""
    rank, failure = item
    return failure.exitcode == -signal.SIGTERM, failure.exitcode == PeerLost.exit_code, failure.timestamp, rank


def main(argv: Sequence[str] | None = None) -> int:
    """Run the workers; 0 when all of them succeed, 75 when they stopped early after saving (a SIGTERM,
    SIGUSR1 or Ctrl-C), 130 when a second Ctrl-C stopped them at once, 1 when one fails."""
    ns = build_parser().parse_args(argv)
    check(ns)
    ns = argparse.Namespace(**{**vars(ns), "training_script": script_path(ns.training_script)})
    check_before_starting(ns)
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    prepare_logs(ns.log_dir, ns.nproc_per_node)
    if "OMP_NUM_THREADS" not in os.environ:  # share the cores instead of oversubscribing them
        os.environ["OMP_NUM_THREADS"] = str(max(1, cores() // ns.nproc_per_node))
    command = shlex.join([sys.executable, "-u", ns.training_script, *ns.training_script_args])
    for line in startup_lines(ns, command):
        print(line, flush=True)
    logging.getLogger(ELASTIC_LOGGER).addFilter(_not_a_repeat)  # adding it twice keeps one
    if ns.max_restarts > 0:
        agent_logger = logging.getLogger(AGENT_LOGGER)
        agent_logger.addFilter(_restart_notice)
        agent_logger.setLevel(min(agent_logger.getEffectiveLevel(), logging.INFO))  # the filter sees INFO
    # torchrun would turn a SIGTERM or SIGINT into its own exit (143, 130), killing workers still saving after
    # 30 s, and SIGUSR1 would kill us and orphan the workers: they go to the workers instead, which save and stop
    argv = torchrun_argv(ns)
    signals_option = _has_signals_option(torchrun)
    if signals_option:
        argv = ["--signals-to-handle", "SIGHUP,SIGQUIT", *argv]
    for name in RELAYED_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _relay_to_workers)
    try:
        with contextlib.nullcontext() if signals_option else _sigterm_stays_ours():
            torchrun.run(torchrun.parse_args(argv))
    except ChildFailedError as failed:
        if _stopped_early(failed.failures.values()):
            print(f"multiproc.py: the processes stopped early after saving a checkpoint (exit code "
                  f"{EXIT_PREEMPTED}); --resume continues the run", file=sys.stderr, flush=True)
            return EXIT_PREEMPTED
        if _interrupted(failed.failures.values()):
            print("multiproc.py: the processes were stopped at once by a second Ctrl-C, without saving; --resume "
                  "continues from their last checkpoint", file=sys.stderr, flush=True)
            return INTERRUPTED
        rank, failure = min(failed.failures.items(), key=_root_cause_first)
        where = "" if failure.local_rank == 0 else \
            f"; see {os.path.join(ns.log_dir, WORKER_LOG.format(failure.local_rank))}"
        print(f"multiproc.py: rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) "
              f"{_describe_exit(failure.exitcode)}{where}; the other processes were stopped",
              file=sys.stderr, flush=True)
        return 1
    except SignalException as stopped:
        print(f"multiproc.py: stopped by {signal.Signals(stopped.sigval).name}", file=sys.stderr, flush=True)
        return 128 + int(stopped.sigval)
    remove_empty_logs(ns.log_dir, ns.nproc_per_node)
    return 0

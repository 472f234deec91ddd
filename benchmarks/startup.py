"""Start-up of a training run on an ImageNet-shaped folder and on its packed copy, side by side.

    python benchmarks/startup.py --make 1000 1281 --rounds 2 /work/bench-data/imagenet-shaped

``--make C N`` first writes DIR/train/ as C classes of N tiny JPEGs each (named as ImageNet's,
``n00000000/n00000000_0.JPEG``; the same 8x8 JPEG of a few hundred bytes for every image of a class, which
is all a scan or a start-up reads) and packs it into ``DIR-packed`` with ``image_classification.data.pack``
(both skipped where they exist).  Then, in rounds that alternate folder and packed copy, it runs the same
``main.py`` command on each (default: ``-a resnet18 --image-size 32 -b 32 -j 2 --prof 3 --training-only
--data-backend pytorch``) and times from the process's start to its third training step's log line; and it
times, in this process, the folder's scan and reading the packed copy's manifest and sample table, as
training does them.  Prints one
line per run and a JSON summary (medians, load average) as its last line.

``--table-memory N`` instead writes a synthetic packed train split of N samples (sparse shard files, a real
sample table) and prints what opening it adds to a fresh process's resident memory.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from image_classification.train.metrics import TRAIN_WINDOW  # noqa: E402

COMMAND = ["-a", "resnet18", "--image-size", "32", "-b", "32", "-j", "2", "--prof", "3", "--training-only",
           "--data-backend", "pytorch", "--epochs", "1", "-p", "1"]


def tiny_jpeg(label: int) -> bytes:
    """An 8x8 JPEG of a colour of its own: a few hundred bytes."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (label * 37 % 256, label * 91 % 256, label * 53 % 256)).save(buffer, "JPEG")
    return buffer.getvalue()


def make_folder(root: Path, classes: int, per_class: int) -> None:
    """``classes`` x ``per_class`` tiny JPEGs under root/train/, a class folder at a time, named as ImageNet's."""
    for label in range(classes):
        folder = root / "train" / f"n{label:08d}"
        if folder.is_dir() and len(os.listdir(folder)) == per_class:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        data = tiny_jpeg(label)
        for index in range(per_class):
            with open(folder / f"n{label:08d}_{index}.JPEG", "wb") as handle:
                handle.write(data)


def time_to_third_step(data: Path, workspace: Path) -> float:
    """Seconds from starting ``main.py`` on ``data`` to its third training step's log line."""
    command = [sys.executable, "-u", str(REPO / "main.py"), *COMMAND, "--workspace", str(workspace), str(data)]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    reached = None
    for line in process.stdout:
        if reached is None and (match := TRAIN_WINDOW.match(line)) and match[2] == "3":
            reached = time.perf_counter() - started
    if process.wait() != 0 or reached is None:
        raise SystemExit(f"{' '.join(command)} failed (exit {process.returncode})")
    return reached


def write_synthetic_split(split: Path, count: int, shards: int = 16, classes: int = 1000) -> list[str]:
    """A packed split of ``count`` samples whose shards are sparse files of the sizes its table needs, with
    the tar headers of their first and last samples only (everything to open and check, nothing to read); its
    class names."""
    import hashlib
    import tarfile

    import numpy as np

    from image_classification.data.packed import (FORMAT, MANIFEST, NAMES, TABLE, TABLE_DTYPE, VERSION, index_name,
                                                  sample_key, shard_name)

    split.mkdir(parents=True, exist_ok=True)
    per_shard = -(-count // shards)
    table = np.zeros(count, dtype=TABLE_DTYPE)
    position = np.arange(count, dtype=np.int64) % per_shard
    table["block"], table["size"], table["label"] = position * 2 + 1, 300, np.arange(count) % classes
    np.save(split / TABLE, table)
    (split / NAMES).write_bytes(b"")
    entries = []
    for number in range(shards):
        samples = min(per_shard, count - number * per_shard)
        with open(split / shard_name(number), "wb") as handle:
            handle.truncate(samples * 1024)
            for position in {0, samples - 1}:  # a header, then the sample's 300 bytes, in every 1024
                header = tarfile.TarInfo(f"{sample_key(number * per_shard + position)}.jpg")
                header.size = 300
                handle.seek(position * 1024)
                handle.write(header.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict"))
        entries.append({"file": shard_name(number), "index": index_name(shard_name(number)), "samples": samples,
                        "bytes": samples * 1024, "sha256": "0" * 64})
    names = [f"n{label:08d}" for label in range(classes)]
    manifest = {"format": FORMAT, "version": VERSION, "classes": names, "samples": count, "shards": entries,
                "table": {"file": TABLE, "sha256": hashlib.sha256((split / TABLE).read_bytes()).hexdigest()},
                "names": {"file": NAMES, "sha256": hashlib.sha256(b"").hexdigest()}}
    (split / MANIFEST).write_text(json.dumps(manifest))
    return names


def table_memory(count: int) -> dict:
    """Resident memory a fresh process gains by opening a synthetic packed split of ``count`` samples."""
    probe = ("import json, resource, sys; from pathlib import Path; "
             "from image_classification.data.packed import open_packed_split; "
             "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * resource.getpagesize(); "
             "before = rss(); split = open_packed_split(Path(sys.argv[1]), json.loads(sys.argv[2])); "
             "print(json.dumps({'samples': len(split), 'before_mb': before / 2**20, "
             "'added_mb': (rss() - before) / 2**20}))")
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as scratch:
        classes = write_synthetic_split(Path(scratch) / "train", count)
        result = subprocess.run([sys.executable, "-c", probe, str(Path(scratch) / "train"), json.dumps(classes)],
                                capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(result.stdout)


def time_split_open(data: Path) -> float:
    """Seconds to check a dataset and open its train split as a run does before its first step: the folder's
    scan, or the packed set's manifest and sample table (read and checked, shards opened)."""
    from image_classification.data.layout import check_dataset, open_split

    started = time.perf_counter()
    classes = check_dataset(str(data), None, want_train=True, want_val=False)
    split = open_split(data, "train", classes)
    elapsed = time.perf_counter() - started
    assert len(split) > 0
    return elapsed


def main(argv: list[str] | None = None) -> int:
    from image_classification.system.cli import UserErrorParser, positive_int

    parser = UserErrorParser(prog="startup.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", metavar="DIR", type=Path, help="the folder (DIR) and its packed copy (DIR-packed)")
    parser.add_argument("--make", nargs=2, type=positive_int, metavar=("CLASSES", "PER_CLASS"),
                        help="first write DIR/train/ with this many tiny JPEGs and pack it")
    parser.add_argument("--rounds", type=positive_int, default=2, help="runs of each, alternating (default: 2)")
    parser.add_argument("--table-memory", type=positive_int, metavar="N",
                        help="only measure the memory a packed split of N samples takes when opened")
    opts = parser.parse_args(argv)
    if opts.table_memory:
        print(json.dumps(table_memory(opts.table_memory)), flush=True)
        return 0
    packed = opts.data.with_name(opts.data.name + "-packed")
    if opts.make:
        started = time.perf_counter()
        make_folder(opts.data, *opts.make)
        print(f"folder written in {time.perf_counter() - started:.0f} s", flush=True)
        from image_classification.data.pack import pack

        pack(opts.data, packed)
    times: dict[str, list[float]] = {"folder": [], "packed": [], "scan": [], "table": []}
    with tempfile.TemporaryDirectory() as scratch:
        for number in range(opts.rounds):
            for name, data in (("folder", opts.data), ("packed", packed)):
                times[name].append(time_to_third_step(data, Path(scratch) / f"{name}{number}"))
                print(f"round {number}: {name}: {times[name][-1]:.1f} s to the third step", flush=True)
            times["scan"].append(time_split_open(opts.data))
            times["table"].append(time_split_open(packed))
            print(f"round {number}: the folder's scan {times['scan'][-1]:.2f} s, the packed copy's manifest and "
                  f"sample table {times['table'][-1]:.2f} s", flush=True)
    summary = {name: statistics.median(values) for name, values in times.items()}
    summary["load_average"] = list(os.getloadavg())
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    from image_classification.system.cli import run

    sys.exit(run(main))

"""How long exporting takes: ONNX through torch.export's exporter against the TorchScript-based one, and the
AOTInductor package, for one model in one process.

Each ONNX exporter writes the same model ``--repeats`` times, the two taking turns, every call timed whole
(trace, translation, optimisation, the file written); the first call of each also pays for what the exporter
loads once per process (onnxscript's operator table), so the JSON keeps every call's time and the summary
gives the first and the best of the rest.  The TorchScript-based exporter runs as model2onnx.py ran it before
torch.export's was the default (opset 17, constant folding, the batch free); torch.export's as it runs now
(opset 18, onnxscript's optimiser).  ``--pt2`` also times one compilation of the package (torch.export, then
AOTInductor and the C++ compiler, for the CPU), as model2onnx.py --output M.pt2 makes it.  Example::

    python benchmarks/export_time.py -a resnet50 --repeats 2 --pt2 -o export_resnet50.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks.common import environment, write_json  # noqa: E402
from image_classification.deploy import torch_export  # noqa: E402
from image_classification.models import build_model, list_models  # noqa: E402
from image_classification.system.cli import UserErrorParser, positive_int, run  # noqa: E402

OLD_OPSET = 17  # model2onnx.py's and the cache's opset before torch.export's exporter was the default


def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="export_time.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("-a", "--arch", default="resnet50", choices=list_models(), metavar="ARCH",
                        help="the model (default: resnet50)")
    parser.add_argument("--image-size", type=positive_int, default=224, metavar="S", help="input size (default: 224)")
    parser.add_argument("--repeats", type=positive_int, default=2, metavar="N",
                        help="exports by each ONNX exporter (default: 2)")
    parser.add_argument("--pt2", action="store_true", help="also time one compilation of the .pt2 package")
    parser.add_argument("-o", "--output", metavar="FILE", default=None, help="JSON file to write")
    return parser


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure(args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    model = build_model(args.arch, num_classes=1000).eval()
    example = torch.randn(torch_export.MIN_TRACED_BATCH, 3, args.image_size, args.image_size)
    exporters = {
        "torchscript": lambda path: torch_export._export_through_torchscript(model, example, path, True, OLD_OPSET),
        "torch.export": lambda path: torch_export._export_through_torch_export(model, example, path, True,
                                                                               torch_export.OPSET),
    }
    seconds: dict[str, list[float]] = {name: [] for name in exporters}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.repeats):
            for name, export in exporters.items():
                path = Path(folder) / f"{name}.onnx"
                seconds[name].append(_timed(lambda: export(path)))
                sizes[name] = path.stat().st_size
        pt2 = None
        if args.pt2:
            from image_classification.deploy.aoti import write_package

            path = Path(folder) / "model.pt2"
            pt2 = _timed(lambda: write_package(model, args.image_size, path, torch.device("cpu"), {}))
            sizes["pt2"] = path.stat().st_size
    return {
        "benchmark": "export_time",
        "config": {"arch": args.arch, "image_size": args.image_size, "repeats": args.repeats},
        "environment": environment(torch.device("cpu")),
        "onnx_seconds": seconds, "pt2_seconds": pt2, "bytes": sizes,
    }


def markdown_block(record: dict, command: str, machine: str) -> str:
    """The command, the ``machine`` it ran on, and one row per export: the first call, the best later one, the
    file's size (docs/performance.md's block, written by scripts/readme_figures.py)."""
    rows = []
    for key, title in (("torchscript", "ONNX, TorchScript-based exporter (opset 17, as before)"),
                       ("torch.export", "ONNX, torch.export's exporter (opset 18, the default)")):
        times = record["onnx_seconds"][key]
        later = f"{min(times[1:]):.1f}" if len(times) > 1 else "-"
        rows.append(f"| {title} | {times[0]:.1f} | {later} | {record['bytes'][key] / 1e6:.1f} |")
    if record.get("pt2_seconds") is not None:
        rows.append(f"| `.pt2` package, AOTInductor for the CPU | {record['pt2_seconds']:.1f} | - | "
                    f"{record['bytes']['pt2'] / 1e6:.1f} |")
    config = record["config"]
    return "\n".join([
        "```bash", command, "```", "",
        f"Measured on {machine}; {config['arch']} at {config['image_size']} px, the batch free.", "",
        "| export | first call, s | later calls, best, s | file, MB |", "|---|---|---|---|", *rows,
    ]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = measure(args)
    print(f"{args.arch} {args.image_size} px on {result['environment']['machine']}")
    for name, times in result["onnx_seconds"].items():
        rest = f", best of the rest {min(times[1:]):.1f} s" if len(times) > 1 else ""
        print(f"  ONNX, {name:>12}: first {times[0]:.1f} s{rest} ({result['bytes'][name] / 1e6:.1f} MB)")
    if result["pt2_seconds"] is not None:
        print(f"  .pt2 package: {result['pt2_seconds']:.1f} s ({result['bytes']['pt2'] / 1e6:.1f} MB)")
    write_json(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))

"""What a device's JPEG decoder makes of the probe JPEGs that decide whether ``pytorch-gpu`` takes it.

    python3 benchmarks/decoder_probe.py --device cuda -o DIR/probe.json

The ``pytorch-gpu`` backend takes a library's device decoder only where it decodes the probe JPEGs
(``data/decoders.py``'s ``probe_jpegs``: colour, greyscale, progressive, EXIF-tagged) within ``DEVICE_LEVELS``
grey levels of the CPU decoder's pixels on average.  For each library it tries, in its order, this prints every
probe's shape and its mean and largest difference in grey levels (or the error the decoder raised), then the
verdict: the decoder taken, or none and why.  Exit code 0 where the device has a decoder, 1 where every library
is refused: the steps that need ``pytorch-gpu`` then have nothing to run.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from image_classification.data import decoders  # noqa: E402
from image_classification.system.cli import UserErrorParser, run  # noqa: E402

PROBE_NAMES = ("colour", "greyscale", "progressive", "EXIF-tagged")  # probe_jpegs' order


def probe(device: torch.device) -> dict:
    """Every library's differences on the probes, and the verdict (the library taken, or the problem)."""
    libraries = {}
    for library in decoders.device_candidates(device):
        decoder = decoders.load(library)
        if decoder is None:
            libraries[library] = {"error": "not installed"}
            continue
        try:
            found = decoders.probe_differences(decoder, device)
        except Exception as error:  # what the decoder raises is the finding
            libraries[library] = {"version": decoder.version, "error": decoders.failure_text(error)}
            continue
        libraries[library] = {"version": decoder.version, "probes": [
            {"probe": name, "shape": list(d.shape), "expected": list(d.expected), "mean_levels": d.mean_levels,
             "max_levels": d.max_levels, "problem": d.problem} for name, d in zip(PROBE_NAMES, found)]}
    problem = decoders.device_problem(device)
    taken = None if problem else decoders.device_decoder(device).name
    return {"device": str(device), "bound_levels": decoders.DEVICE_LEVELS, "cpu_decoder": decoders.cpu_decoder().name,
            "libraries": libraries, "taken": taken, "problem": problem}


def lines(result: dict) -> list[str]:
    """The probe's figures as a person reads them."""
    text = [f"device {result['device']}: each probe against {result['cpu_decoder']} on the CPU (taken within "
            f"{result['bound_levels']:g} grey levels on average)"]
    for library, found in result["libraries"].items():
        if "error" in found:
            text.append(f"  {library}: {found['error']}")
            continue
        for entry in found["probes"]:
            if entry["mean_levels"] is None:
                figures = f"shape {tuple(entry['shape'])}, expected {tuple(entry['expected'])}"
            else:
                figures = f"mean {entry['mean_levels']:.3f}, max {entry['max_levels']} grey levels"
            text.append(f"  {library} {found['version']} {entry['probe']}: {figures}")
    text.append(f"taken: {result['taken']}" if result["taken"] else f"refused: {result['problem']}")
    return text


def build_parser() -> UserErrorParser:
    parser = UserErrorParser(prog="decoder_probe.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None,
                        help="the device whose decoder is probed (default: cuda where there is one, else cpu)")
    parser.add_argument("-o", "--output", metavar="JSON", help="also write the figures there")
    return parser


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    opts.device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    result = probe(torch.device(opts.device))
    print("\n".join(lines(result)), flush=True)
    if opts.output:
        from benchmarks.common import write_json

        write_json(result, opts.output)
    return 0 if result["taken"] else 1


if __name__ == "__main__":
    sys.exit(run(main))

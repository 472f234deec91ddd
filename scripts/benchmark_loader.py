"""Kept for one release: this benchmark is now benchmarks/benchmark_loader.py, which this old path runs."""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parents[1] / "benchmarks" / Path(__file__).name), run_name="__main__")

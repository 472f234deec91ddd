#!/usr/bin/env bash
# EfficientNet-B0 inference benchmark, mixed precision (fp16 autocast, loss scaling), 8 GPUs of a DGX A100:
# a benchmark_inference run per batch size (1, 2, 4, 8, 16, 32, 64, 128, 256), each writing
# raport_<batch>.json, as the reference's.
#
# Usage: bash efficientnet/inference/AMP/DGXA100_efficientnet-b0_AMP.sh [WORKSPACE [DATA_DIR [FLAGS ...]]]
#   WORKSPACE  where raport_<batch>.json and GPU_k.log go (default: ./)
#   DATA_DIR   ImageNet with train/ and val/ (default: /imagenet)
#   FLAGS      more main.py flags, e.g. --data-backend synthetic; they come last, so they win over
#              the preset (a -b among them sets the batch of every run of the sweep)
#   PYTHON     the interpreter (environment variable; default: the repository's .venv/bin/python
#              when it exists, else python3)
# Runs from any directory: relative paths are taken from the directory you call it in.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
source "${REPO}/scripts/recipe_args.sh"  # WORKSPACE, DATA_DIR, PYTHON, inference_sweep; FLAGS in "$@"

inference_sweep efficientnet-b0 AMP DGXA100 "1 2 4 8 16 32 64 128 256" "$@"

#!/usr/bin/env bash
# EfficientNet-B0, TF32, 8 GPUs of a DGX A100, 400 epochs: the reference's recipe.
#
# Usage: bash efficientnet/training/TF32/DGXA100_efficientnet-b0_TF32.sh [WORKSPACE [DATA_DIR [FLAGS ...]]]
#   WORKSPACE  where checkpoints, raport.json and GPU_k.log go (default: ./)
#   DATA_DIR   ImageNet with train/ and val/ (default: /imagenet)
#   FLAGS      more main.py flags, e.g. -b 64; they come last, so they win over the preset
#   PYTHON     the interpreter (environment variable; default: the repository's .venv/bin/python
#              when it exists, else python3)
# Runs from any directory: relative paths are taken from the directory you call it in.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
source "${REPO}/scripts/recipe_args.sh"  # sets WORKSPACE, DATA_DIR and PYTHON; leaves FLAGS in "$@"

exec "${PYTHON}" "${REPO}/multiproc.py" --nproc_per_node 8 --log_dir "${WORKSPACE}" \
    "${REPO}/launch.py" --model efficientnet-b0 --precision TF32 --mode convergence \
    --platform DGXA100 "${DATA_DIR}" --workspace "${WORKSPACE}" --raport-file raport.json "$@"

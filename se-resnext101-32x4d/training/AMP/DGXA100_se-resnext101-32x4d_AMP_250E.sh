#!/usr/bin/env bash
# SE-ResNeXt101-32x4d, mixed precision (fp16 autocast, loss scaling), 8 GPUs of a DGX A100, 250 epochs with MixUp 0.2.
#
# Usage: bash se-resnext101-32x4d/training/AMP/DGXA100_se-resnext101-32x4d_AMP_250E.sh [WORKSPACE [DATA_DIR [FLAGS ...]]]
#   WORKSPACE  where checkpoints, raport.json and GPU_k.log go (default: ./)
#   DATA_DIR   ImageNet with train/ and val/ (default: /imagenet)
#   FLAGS      more main.py flags, e.g. -b 128; they come last, so they win over the preset
#   PYTHON     the interpreter (environment variable; default: the repository's .venv/bin/python
#              when it exists, else python3)
# Runs from any directory: relative paths are taken from the directory you call it in.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
source "${REPO}/scripts/recipe_args.sh"  # sets WORKSPACE, DATA_DIR and PYTHON; leaves FLAGS in "$@"

exec "${PYTHON}" "${REPO}/multiproc.py" --nproc_per_node 8 --log_dir "${WORKSPACE}" \
    "${REPO}/launch.py" --model se-resnext101-32x4d --precision AMP --mode convergence --platform DGXA100 \
    "${DATA_DIR}" --workspace "${WORKSPACE}" --raport-file raport.json "$@"

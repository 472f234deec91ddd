#!/usr/bin/env bash
# SE-ResNeXt101-32x4d, TF32, 8 GPUs of a DGX A100, 90 epochs without MixUp.
#
# Usage: bash se-resnext101-32x4d/training/TF32/DGXA100_se-resnext101-32x4d_TF32_90E.sh [WORKSPACE] [DATA_DIR]
#   WORKSPACE  where checkpoints, raport.json and GPU_k.log go (default: ./)
#   DATA_DIR   ImageNet with train/ and val/ (default: /imagenet)
#   PYTHON     the interpreter to use (environment variable; default: python)
# Runs from any directory: relative paths are taken from the directory you call it in.
set -euo pipefail

WORKSPACE=${1:-./}
DATA_DIR=${2:-/imagenet}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)

exec "${PYTHON:-python}" "${REPO}/multiproc.py" --nproc_per_node 8 --log_dir "${WORKSPACE}" \
    "${REPO}/launch.py" --model se-resnext101-32x4d --precision TF32 --mode convergence --platform DGXA100 \
    "${DATA_DIR}" --epochs 90 --mixup 0.0 --workspace "${WORKSPACE}" --raport-file raport.json

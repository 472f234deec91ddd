#!/usr/bin/env bash
# ResNeXt101-32x4d, mixed precision (fp16 autocast, loss scaling), 8 GPUs of a DGX H100, 90 epochs without MixUp.
#
# Usage: bash resnext101-32x4d/training/AMP/DGXH100_resnext101-32x4d_AMP_90E.sh [WORKSPACE] [DATA_DIR]
#   WORKSPACE  where checkpoints, raport.json and GPU_k.log go (default: ./)
#   DATA_DIR   ImageNet with train/ and val/ (default: /imagenet)
#   PYTHON     the interpreter to use (environment variable; default: python)
# Runs from any directory: relative paths are taken from the directory you call it in.
set -euo pipefail

WORKSPACE=${1:-./}
DATA_DIR=${2:-/imagenet}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)

exec "${PYTHON:-python}" "${REPO}/multiproc.py" --nproc_per_node 8 --log_dir "${WORKSPACE}" \
    "${REPO}/launch.py" --model resnext101-32x4d --precision AMP --mode convergence --platform DGXH100 \
    "${DATA_DIR}" --epochs 90 --mixup 0.0 --workspace "${WORKSPACE}" --raport-file raport.json

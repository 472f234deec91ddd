#!/usr/bin/env bash
# ResNet50 v1.5, mixed precision (fp16 autocast, loss scaling), 8 GPUs of a DGX-1V (V100), 90 epochs without MixUp.
#
# Usage: bash resnet50v1.5/training/AMP/DGX1V_resnet50_AMP_90E.sh [WORKSPACE] [DATA_DIR]
#   WORKSPACE  where checkpoints, raport.json and GPU_k.log go (default: ./)
#   DATA_DIR   ImageNet with train/ and val/ (default: /imagenet)
#   PYTHON     the interpreter to use (environment variable; default: python)
# Runs from any directory: relative paths are taken from the directory you call it in.
set -euo pipefail

WORKSPACE=${1:-./}
DATA_DIR=${2:-/imagenet}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)

exec "${PYTHON:-python}" "${REPO}/multiproc.py" --nproc_per_node 8 --log_dir "${WORKSPACE}" \
    "${REPO}/launch.py" --model resnet50 --precision AMP --mode convergence --platform DGX1V \
    "${DATA_DIR}" --epochs 90 --mixup 0.0 --workspace "${WORKSPACE}" --raport-file raport.json

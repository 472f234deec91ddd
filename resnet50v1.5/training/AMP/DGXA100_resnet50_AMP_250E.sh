#!/usr/bin/env bash
# ResNet50 v1.5, mixed precision (fp16 autocast, loss scaling), 8 GPUs of a DGX A100, 250 epochs with MixUp 0.2.
#
# Usage: bash resnet50v1.5/training/AMP/DGXA100_resnet50_AMP_250E.sh [WORKSPACE] [DATA_DIR]
#   WORKSPACE  where checkpoints, raport.json and GPU_k.log go (default: ./)
#   DATA_DIR   ImageNet with train/ and val/ (default: /imagenet)
#   PYTHON     the interpreter to use (environment variable; default: python)
# Runs from any directory: relative paths are taken from the directory you call it in.
set -euo pipefail

WORKSPACE=${1:-./}
DATA_DIR=${2:-/imagenet}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)

exec "${PYTHON:-python}" "${REPO}/multiproc.py" --nproc_per_node 8 --log_dir "${WORKSPACE}" \
    "${REPO}/launch.py" --model resnet50 --precision AMP --mode convergence --platform DGXA100 \
    "${DATA_DIR}" --workspace "${WORKSPACE}" --raport-file raport.json

#!/usr/bin/env bash
# EfficientNet-WideSE-B0 inference benchmark, FP32, 8 GPUs of a DGX A100: a benchmark_inference run per
# batch size (1, 2, 4, 8, 16, 32, 64, 128), each writing raport_<batch>.json, as the reference's.
#
# Usage: bash efficientnet/inference/FP32/DGXA100_efficientnet-widese-b0_FP32.sh
#            [WORKSPACE [DATA_DIR [FLAGS ...]]]
#   WORKSPACE  where raport_<batch>.json and GPU_k.log go (default: ./)
#   DATA_DIR   ImageNet with train/ and val/ (default: /imagenet)
#   FLAGS      more main.py flags, e.g. --data-backend synthetic; they come last, so they win over
#              the preset (a -b among them sets the batch of every run of the sweep)
#   PYTHON     the interpreter (environment variable; default: the repository's .venv/bin/python
#              when it exists, else python3)
# Runs from any directory: relative paths are taken from the directory you call it in.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
source "${REPO}/scripts/recipe_args.sh"  # sets WORKSPACE, DATA_DIR and PYTHON; leaves FLAGS in "$@"

for batch in 1 2 4 8 16 32 64 128; do
    "${PYTHON}" "${REPO}/multiproc.py" --nproc_per_node 8 --log_dir "${WORKSPACE}" \
        "${REPO}/launch.py" --model efficientnet-widese-b0 --precision FP32 --mode benchmark_inference \
        --platform DGXA100 "${DATA_DIR}" -b "${batch}" --workspace "${WORKSPACE}" \
        --raport-file "raport_${batch}.json" "$@"
done

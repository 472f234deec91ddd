#!/usr/bin/env bash
# EfficientNet-B0 quantization-aware training (efficientnet-quant-b0), 8 GPUs of a DGX-1V (V100 32 GB), from
# trained weights: the reference's command line for quant_main.py, the quantization-aware trainer.
#
# Usage: bash efficientnet/quantization/DGX1V-32G_efficientnet-quant-b0_FP32.sh WEIGHTS
#   WEIGHTS    the trained efficientnet-b0 weights to start from (checkpoint2model.py's output, or NGC's)
#   PYTHON     the interpreter (environment variable; default: the repository's .venv/bin/python
#              when it exists, else python3)
# Reads ImageNet from /imagenet and writes to the directory you call it in, as the reference's script.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WEIGHTS=${1:?usage: $0 WEIGHTS (the trained efficientnet-b0 weights to start from)}
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "${REPO}/.venv/bin/python" ]]; then PYTHON="${REPO}/.venv/bin/python"; else PYTHON=python3; fi
fi

exec "${PYTHON}" "${REPO}/multiproc.py" --nproc_per_node 8 "${REPO}/quant_main.py" /imagenet \
    --arch efficientnet-quant-b0 \
    --epochs 10 \
    -j5 -p 500 \
    --data-backend pytorch \
    --optimizer sgd \
    -b 128 \
    --lr 0.0125 \
    --momentum 0.89 \
    --weight-decay 4.50e-05 \
    --lr-schedule cosine \
    --pretrained-from-file "${WEIGHTS}"

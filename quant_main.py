"""Quantization-aware training: main.py with fake int8 quantization (``python quant_main.py -h``).

Example, the reference's command line::

    python quant_main.py /imagenet --arch efficientnet-quant-b0 --epochs 10 --optimizer sgd -b 128 --lr 0.0125 \
        --momentum 0.89 --weight-decay 4.50e-05 --lr-schedule cosine --pretrained-from-file weights.pth
"""

import sys

from image_classification.system.signals import catch_early

catch_early()  # before torch is imported: a SIGTERM during start-up then stops the run cleanly (exit 75)

from image_classification.commands import quant_train  # noqa: E402

if __name__ == "__main__":
    sys.exit(quant_train(prog="quant_main.py"))

"""Export a model to ONNX and check it against PyTorch with onnxruntime.

Example::

    python model2onnx.py --arch resnet50 --weights weights.pth --output resnet50.onnx -b 1 --dynamic-batch
"""

import sys

from image_classification.cli import run
from image_classification.export import model2onnx_main

if __name__ == "__main__":
    sys.exit(run(model2onnx_main))

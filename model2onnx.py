"""Export a model to ONNX and check it against PyTorch with onnxruntime.

Example::

    python model2onnx.py --arch resnet50 --weights weights.pth --output resnet50.onnx -b 1 --dynamic-batch
"""

import sys

from image_classification.commands import model2onnx

if __name__ == "__main__":
    sys.exit(model2onnx())


"""Classify images with a trained model.  ``python classify.py -h`` lists every flag.

Example: ``python classify.py --arch resnet50 --weights nvidia_resnet50_200821.pth.tar --image cat.jpg``
"""

import sys

from image_classification.commands import classify

if __name__ == "__main__":
    sys.exit(classify())

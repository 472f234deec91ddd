# NVIDIA's NGC PyTorch image, as the reference's: CUDA, cuDNN, NCCL, torch, torchvision and DALI built and
# tested together.  Build: docker build . -t convnets
# Run:   docker run --rm -it --gpus all --ipc=host -v /imagenet:/imagenet convnets
# Another NGC release: docker build --build-arg FROM_IMAGE_NAME=nvcr.io/nvidia/pytorch:<YY.MM>-py3 .
ARG FROM_IMAGE_NAME=nvcr.io/nvidia/pytorch:26.07-py3
FROM ${FROM_IMAGE_NAME}

ENV PYTHONUNBUFFERED=1
WORKDIR /workspace/rn50

# Only the requirements the image lacks, at our pins. The image's own builds (torch, torchvision, DALI,
# numpy, Pillow, ...) stay: its pip constraints file pins them, and ours would replace them or clash.
COPY requirements.txt scripts/container_requirements.py /workspace/
RUN cd /workspace && python container_requirements.py requirements.txt > requirements-missing.txt \
    && if [ -s requirements-missing.txt ]; then pip install --no-cache-dir -r requirements-missing.txt; fi

COPY . /workspace/rn50
# The ic-* commands, editable so that they run the code in /workspace/rn50.
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e .

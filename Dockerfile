# A self-contained image: the pinned requirements (torch's CUDA wheels carry their own CUDA libraries).
# Build: docker build . -t convnets     Run: docker run --rm -it --gpus all --ipc=host -v /imagenet:/imagenet convnets
ARG FROM_IMAGE_NAME=python:3.11-slim
FROM ${FROM_IMAGE_NAME}

ENV PYTHONUNBUFFERED=1
WORKDIR /workspace/rn50
COPY requirements.txt /workspace/
RUN pip install --no-cache-dir -r /workspace/requirements.txt
COPY . /workspace/rn50

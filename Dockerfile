# CPU image by default. For NVIDIA GPUs:
#   docker build --build-arg BASE=nvidia/cuda:12.8.1-runtime-ubuntu24.04 \
#                --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 -t tidegate:cuda .
ARG BASE=python:3.11-slim
FROM ${BASE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    TIDEGATE_MODEL_DIR=/opt/tidegate/models TIDEGATE_KERNEL_DIR=/opt/tidegate/kernels

RUN if ! command -v python3 >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends python3 python3-pip python3-venv \
        && rm -rf /var/lib/apt/lists/*; fi \
    && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# torch first and pinned, from the index that matches the base image (CPU or CUDA).
RUN pip install torch==2.13.0 --index-url ${TORCH_INDEX_URL}

WORKDIR /app
COPY pyproject.toml README.md ./
COPY tidegate ./tidegate
COPY gateway ./gateway
COPY backend ./backend
COPY limiter ./limiter
COPY quota ./quota
COPY config ./config
COPY bench ./bench
RUN pip install .

# The default model is baked into the image: nothing downloads weights at run time.
RUN tidegate model pull smollm2

# The CPU quantized kernel (--quantization auto) is compiled into the image, so containers need no compiler;
# the compiler is removed again in the same layer.
RUN apt-get update && apt-get install -y --no-install-recommends g++ \
    && python -m backend.executor.cpu.block_kernel build \
    && apt-get purge -y --auto-remove g++ && rm -rf /var/lib/apt/lists/*

EXPOSE 8000 9001
# The keys are created in the data dir and never printed into the container log; read them with
#   docker exec CONTAINER cat /root/.local/share/tidegate/admin_key
CMD ["tidegate", "up", "--host", "0.0.0.0", "--no-show-keys"]

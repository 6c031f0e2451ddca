# GPU runner image: llama.cpp (CUDA build of llama-cpp-python) + benchcal.
#   docker build -f docker/llama-cpp-cuda.Dockerfile -t benchcal-llama-cuda .
#   docker run --rm --gpus all -v $PWD/runs:/work/runs benchcal-llama-cuda \
#       benchcal bench --gpu auto --sweep harness/sweeps/gpu-calibration.toml --runs-dir /work/runs
ARG CUDA_VERSION=12.6.3
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 CUDA_MODULE_LOADING=LAZY
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev build-essential cmake git ninja-build \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# CUDA build of llama.cpp inside llama-cpp-python. CMAKE_CUDA_ARCHITECTURES: 80 (A100), 86 (A10/30xx),
# 89 (L4/L40S/40xx), 90 (H100/H200), 100/120 (Blackwell, CUDA >= 12.8).
ARG CUDA_ARCHS="80;86;89;90"
ARG LLAMA_CPP_PYTHON_VERSION=0.3.36
RUN CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS}" \
    pip install "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}"

WORKDIR /work
COPY . /work
RUN pip install -e ".[llama,gpu,dev]"
CMD ["benchcal", "--help"]

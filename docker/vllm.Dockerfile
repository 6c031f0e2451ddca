# GPU runner image: vLLM (the project's OpenAI-compatible server image) + benchcal.
#   docker build -f docker/vllm.Dockerfile -t benchcal-vllm .
#   docker run --rm --gpus all --ipc=host -v $PWD/runs:/work/runs benchcal-vllm \
#       benchcal bench --gpu auto --engine vllm --model qwen2.5-7b --quant BF16 --runs-dir /work/runs
ARG VLLM_VERSION=v0.11.0
FROM vllm/vllm-openai:${VLLM_VERSION}

ENV PYTHONUNBUFFERED=1 CUDA_MODULE_LOADING=LAZY
WORKDIR /work
COPY . /work
# vLLM and torch come with the base image; install benchcal without touching them.
RUN pip install --no-cache-dir -e ".[gpu,dev]"
ENTRYPOINT []
CMD ["benchcal", "--help"]

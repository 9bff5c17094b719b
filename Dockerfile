# kernelrl's default job in a container, built by the repository's own scripts on Debian bookworm.
#   docker build --build-arg CUDA_KEYRING_URL=URL -t kernelrl .   # URL: see CUDA_KEYRING_URL below
#   docker run --rm kernelrl   # build/launch configs/local.toml on the CPU
#   docker run --rm --gpus all kernelrl   # on the GPUs (NVIDIA Container Toolkit)
#   docker run --rm kernelrl build/launch check configs/kernelbench-level1.toml
# scripts/setup installs the Debian packages and the two Python environments (torch's and the
# tracking libraries') into the image. The locked torch (2.11.0 from PyPI) is a CUDA 13.0 build whose
# CMake files need a CUDA 13.0 toolkit with nvcc on PATH even to configure a CPU-only build: it comes
# from NVIDIA's Debian 12 repository.
# Checked without Docker (none on the development machine), 2026-11-26: these steps replayed in a
# debootstrap'd bookworm chroot, with a CUDA 13.0 toolkit at /usr/local/cuda, built launch on the
# image's Python 3.11 and ran the default job to its fifth training step (stopped there).
# Sandbox: under Docker's default seccomp profile the evaluator cannot make namespaces, so each
# candidate runs as a uid of its own on the container's files (no private /tmp, network or PID namespace;
# the worker logs what it got). That user must read the Python environment and the build cache:
# they live in /opt/kernelrl-cache, not under /root. For the full sandbox (namespaces, a private
# file view) run with --security-opt seccomp=unconfined --cap-add SYS_ADMIN, or --privileged.
FROM debian:bookworm
ENV DEBIAN_FRONTEND=noninteractive
# CUDA_KEYRING_URL: the cuda-keyring .deb of NVIDIA's Debian 12 (x86_64) repository, as NVIDIA's CUDA
# installation guide gives it ("network repo" installation).
ARG CUDA_KEYRING_URL
RUN test -n "$CUDA_KEYRING_URL" \
      || { echo "docker build --build-arg CUDA_KEYRING_URL=...: NVIDIA's cuda-keyring .deb for Debian 12" >&2; exit 1; } \
 && apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv git wget \
 && wget -q -O /tmp/cuda-keyring.deb "$CUDA_KEYRING_URL" \
 && dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
 && apt-get update \
 && apt-get install -y --no-install-recommends cuda-toolkit-13-0 \
 && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/local/cuda/bin:$PATH
# The Python environments and the build cache where any uid (a candidate runs as its own, without namespaces) can read them.
ENV KERNELRL_CACHE=/opt/kernelrl-cache XDG_CACHE_HOME=/opt/kernelrl-cache/xdg
WORKDIR /opt/kernelrl
COPY . .
RUN scripts/build && rm -rf /opt/kernelrl-cache/xdg/pip /root/.cache/pip
CMD ["build/launch", "configs/local.toml"]

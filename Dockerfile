# kernelrl's default job in a container, built by the repository's own scripts on Debian bookworm.
#   docker build -t kernelrl .
#   docker run --rm kernelrl                    # build/launch configs/local.toml on the CPU
#   docker run --rm --gpus all kernelrl         # on the machine's GPUs (NVIDIA Container Toolkit)
#   docker run --rm kernelrl build/launch check configs/kernelbench-level1.toml
# scripts/setup installs the Debian packages and the two Python environments (torch's and the
# tracking libraries') into the image; the CUDA decode kernels are built only where the image has
# nvcc (a CUDA base image), else the policy runs LibTorch's ops on the GPU.
FROM debian:bookworm
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv git \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/kernelrl
COPY . .
RUN scripts/build && rm -rf /root/.cache/pip
CMD ["build/launch", "configs/local.toml"]

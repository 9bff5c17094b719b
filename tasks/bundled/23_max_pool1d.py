import torch
import torch.nn as nn


class Model(nn.Module):
    """Max pooling over windows of 4 with stride 4."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool1d(x, 4, 4)


batch_size = 16
channels = 32
length = 2048
# Sizes for GPU evaluation (the harness applies them on CUDA devices; KernelBench ignores them).
GPU_SIZES = {"batch_size": 128, "channels": 256, "length": 32768}


def get_inputs():
    return [torch.randn(batch_size, channels, length)]


def get_init_inputs():
    return []

import torch
import torch.nn as nn


class Model(nn.Module):
    """Depthwise 1-D convolution, kernel 5."""

    def __init__(self, channels):
        super(Model, self).__init__()
        self.conv = nn.Conv1d(channels, channels, 5, padding=2, groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch_size = 8
channels = 64
length = 1024
# Sizes for GPU evaluation (the harness applies them on CUDA devices; KernelBench ignores them).
GPU_SIZES = {"batch_size": 64, "channels": 512, "length": 16384}


def get_inputs():
    return [torch.randn(batch_size, channels, length)]


def get_init_inputs():
    return [channels]

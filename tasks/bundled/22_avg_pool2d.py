import torch
import torch.nn as nn


class Model(nn.Module):
    """2x2 average pooling."""

    def __init__(self):
        super(Model, self).__init__()
        self.pool = nn.AvgPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


batch_size = 8
channels = 32
height = 64
width = 64
# Sizes for GPU evaluation (the harness applies them on CUDA devices; KernelBench ignores them).
GPU_SIZES = {"batch_size": 64, "channels": 128, "height": 256, "width": 256}


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return []

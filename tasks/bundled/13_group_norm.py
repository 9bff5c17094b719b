import torch
import torch.nn as nn


class Model(nn.Module):
    """GroupNorm over a 4-D activation."""

    def __init__(self, num_groups, channels):
        super(Model, self).__init__()
        self.gn = nn.GroupNorm(num_groups, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gn(x)


batch_size = 8
channels = 64
num_groups = 8
height = 32
width = 32
# Sizes for GPU evaluation (the harness applies them on CUDA devices; KernelBench ignores them).
GPU_SIZES = {"batch_size": 64, "channels": 256, "num_groups": 32, "height": 64, "width": 64}


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [num_groups, channels]

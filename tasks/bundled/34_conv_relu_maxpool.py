import torch
import torch.nn as nn


class Model(nn.Module):
    """Convolution, ReLU, 2x2 max pooling (fused multi-op)."""

    def __init__(self, in_channels, out_channels):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)


batch_size = 4
in_channels = 16
out_channels = 32
height = 32
width = 32
# Sizes for GPU evaluation (the harness applies them on CUDA devices; KernelBench ignores them).
GPU_SIZES = {"batch_size": 32, "in_channels": 64, "out_channels": 128, "height": 128, "width": 128}


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]

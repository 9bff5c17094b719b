import torch
import torch.nn as nn


class Model(nn.Module):
    """Adds a bias, applies exact GELU, scales (fused multi-op)."""

    def __init__(self, dim, scale):
        super(Model, self).__init__()
        self.bias = nn.Parameter(torch.randn(dim))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x + self.bias) * self.scale


batch_size = 128
dim = 4096
# Sizes for GPU evaluation (the harness applies them on CUDA devices; KernelBench ignores them).
GPU_SIZES = {"batch_size": 8192, "dim": 16384}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim, 0.5]

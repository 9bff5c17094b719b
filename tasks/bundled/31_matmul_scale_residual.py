import torch
import torch.nn as nn


class Model(nn.Module):
    """Matrix product, scaling and a residual add (fused multi-op)."""

    def __init__(self, dim, alpha):
        super(Model, self).__init__()
        self.weight = nn.Parameter(torch.randn(dim, dim) / dim ** 0.5)
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.matmul(x, self.weight)
        y = y * self.alpha
        return y + x


batch_size = 256
dim = 512
# Sizes for GPU evaluation (the harness applies them on CUDA devices; KernelBench ignores them).
GPU_SIZES = {"batch_size": 8192, "dim": 4096}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim, 0.5]

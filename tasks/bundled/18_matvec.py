import torch
import torch.nn as nn


class Model(nn.Module):
    """Matrix-vector product with the vector as a column."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, v)


m = 1024
k = 2048
# Sizes for GPU evaluation (the harness applies them on CUDA devices; KernelBench ignores them).
GPU_SIZES = {"m": 16384, "k": 16384}


def get_inputs():
    return [torch.randn(m, k), torch.randn(k, 1)]


def get_init_inputs():
    return []

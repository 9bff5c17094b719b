import torch
import torch.nn as nn


class Model(nn.Module):
    """Product with a transposed second operand, A @ B^T."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b.t().contiguous())


m = 256
k = 256
n = 256
# Sizes for GPU evaluation (the harness applies them on CUDA devices; KernelBench ignores them).
GPU_SIZES = {"m": 4096, "k": 4096, "n": 4096}


def get_inputs():
    return [torch.randn(m, k), torch.randn(n, k)]


def get_init_inputs():
    return []

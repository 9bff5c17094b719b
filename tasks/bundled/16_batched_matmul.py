import torch
import torch.nn as nn


class Model(nn.Module):
    """Batched matrix product."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


batch = 8
n = 128
# Sizes for GPU evaluation (the harness applies them on CUDA devices; KernelBench ignores them).
GPU_SIZES = {"batch": 64, "n": 1024}


def get_inputs():
    return [torch.randn(batch, n, n), torch.randn(batch, n, n)]


def get_init_inputs():
    return []

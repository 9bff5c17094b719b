import torch
import torch.nn as nn


class Model(nn.Module):
    """Inclusive prefix sum along each row."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=1)


batch_size = 128
dim = 1024
# Sizes for GPU evaluation (the harness applies them on CUDA devices; KernelBench ignores them).
GPU_SIZES = {"batch_size": 8192, "dim": 8192}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []

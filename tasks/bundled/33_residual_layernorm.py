import torch
import torch.nn as nn


class Model(nn.Module):
    """Residual add followed by LayerNorm (fused multi-op)."""

    def __init__(self, dim):
        super(Model, self).__init__()
        self.ln = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return self.ln(x + r)


batch_size = 128
dim = 1024
# Sizes for GPU evaluation (the harness applies them on CUDA devices; KernelBench ignores them).
GPU_SIZES = {"batch_size": 16384, "dim": 4096}


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]

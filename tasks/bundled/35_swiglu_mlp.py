import torch
import torch.nn as nn


class Model(nn.Module):
    """SwiGLU gate: silu(x W1^T) * (x W2^T) (fused multi-op)."""

    def __init__(self, dim, hidden):
        super(Model, self).__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(self.w1(x)) * self.w2(x)


batch_size = 128
dim = 512
hidden = 1024
# Sizes for GPU evaluation (the harness applies them on CUDA devices; KernelBench ignores them).
GPU_SIZES = {"batch_size": 8192, "dim": 4096, "hidden": 11008}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim, hidden]

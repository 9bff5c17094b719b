import math
import torch
import torch.nn as nn


class Model(nn.Module):
    """Scaled dot-product attention written out (fused multi-op)."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        return torch.matmul(torch.softmax(s, dim=-1), v)


batch_size = 2
heads = 4
seq_len = 128
head_dim = 64
# Sizes for GPU evaluation (the harness applies them on CUDA devices; KernelBench ignores them).
GPU_SIZES = {"batch_size": 16, "heads": 16, "seq_len": 2048, "head_dim": 64}


def get_inputs():
    return [torch.randn(batch_size, heads, seq_len, head_dim) for _ in range(3)]


def get_init_inputs():
    return []

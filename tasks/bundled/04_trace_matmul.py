import torch
import torch.nn as nn


class Model(nn.Module):
    """Trace of a matrix product: trace(A @ B)."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.trace(A @ B)


N = 384


def get_inputs():
    # Positive entries: the trace is far from zero, so relative tolerance applies.
    A = torch.rand(N, N)
    B = torch.rand(N, N)
    return [A, B]


def get_init_inputs():
    return []

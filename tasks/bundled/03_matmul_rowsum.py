import torch
import torch.nn as nn


class Model(nn.Module):
    """Row sums of a matrix product: (A @ B).sum(dim=1, keepdim=True)."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B).sum(dim=1, keepdim=True)


M = 256
K = 512
N = 256


def get_inputs():
    # Positive entries: sums never cancel, so tolerances are meaningful.
    A = torch.rand(M, K)
    B = torch.rand(K, N)
    return [A, B]


def get_init_inputs():
    return []

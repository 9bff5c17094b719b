import torch
import torch.nn as nn


class Model(nn.Module):
    """Scales the rows of B by the entries of A, written as a dense diag(A) @ B."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.diag(A) @ B


N = 512
M = 512


def get_inputs():
    A = torch.randn(N)
    B = torch.randn(N, M)
    return [A, B]


def get_init_inputs():
    return []

import torch
import torch.nn as nn


class Model(nn.Module):
    """Linear layer followed by ReLU (fused multi-op)."""

    def __init__(self, in_features, out_features):
        super(Model, self).__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


batch_size = 128
in_features = 512
out_features = 512
# Sizes for GPU evaluation (the harness applies them on CUDA devices; KernelBench ignores them).
GPU_SIZES = {"batch_size": 8192, "in_features": 4096, "out_features": 4096}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]

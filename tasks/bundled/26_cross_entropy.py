import torch
import torch.nn as nn


class Model(nn.Module):
    """Cross-entropy of logits against class indices."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits, targets)


batch_size = 512
num_classes = 1000
# Sizes for GPU evaluation (the harness applies them on CUDA devices; KernelBench ignores them).
GPU_SIZES = {"batch_size": 32768, "num_classes": 4096}


def get_inputs():
    return [torch.randn(batch_size, num_classes), torch.randint(0, num_classes, (batch_size,))]


def get_init_inputs():
    return []

# A full program for KernelBench's level1/1 (square matmul) whose work runs on a stream of its own
# that never waits for the caller's stream, and joins back before returning. Under a timing
# protocol that keeps the GPU busy before its start event, the matmul would run early, unseen;
# its inputs, written on the caller's stream just before the call, would be read before they
# are written. The evaluator's ordering check must reject it.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = torch.cuda.Stream()

    def forward(self, A, B):
        with torch.cuda.stream(self.side):  # no wait_stream(current): not ordered after the caller
            C = torch.matmul(A, B)
        torch.cuda.current_stream().wait_stream(self.side)
        return C

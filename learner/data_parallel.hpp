// Data-parallel learning: the ranks of one learner each accumulate their share of a step's groups
// (LoraTrainer::accumulate), then meet in LibTorch's own collectives (c10d) inside
// LoraTrainer::step: one all-reduce sums their gradients and statistics, so every rank clips and
// takes the same AdamW step and holds the same adapter afterwards. The collectives are c10d's:
// ProcessGroupGloo for ranks on the CPU (its library ships inside the pip LibTorch, its headers come
// from Debian's libgloo-dev, which scripts/setup unpacks into the cache; without them
// gloo_available() is false) and ProcessGroupNCCL for ranks on GPUs (inside libtorch_cuda; its
// NCCL header from the nvidia-nccl wheel beside torch; without it nccl_available() is false).
// Includes torch: learner/ only.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace kernelrl {

class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sums `flat` (one contiguous tensor) over the ranks, in place: every rank gets the sum.
  virtual void sum(torch::Tensor& flat) = 0;
};

// Whether this build has c10d's gloo backend (the gloo headers were found).
bool gloo_available();
// Whether this build has c10d's NCCL backend (the NCCL header was found).
bool nccl_available();

// Rank `rank` of `size` through c10d's ProcessGroupGloo. The ranks meet through a store they all
// reach: "file:PATH" (c10d's FileStore: one machine or a shared file system; the file must not be
// left over from another group) or "tcp://HOST:PORT" (c10d's TCPStore, served by rank 0 on that
// address). `host` is the address this rank's own connections use (its name or IP as the others
// reach it). A rank that does not arrive within `timeout` fails the others' setup or collective.
std::unique_ptr<GradientReducer> gloo_reducer(const std::string& store, int rank, int size, const std::string& host,
                                              std::chrono::milliseconds timeout = std::chrono::minutes(5));

// The reducers of `devices.size()` ranks of this process, rank i on devices[i], meeting through
// one in-process store (c10d's HashStore): every device "cpu" (ProcessGroupGloo over loopback) or
// every device "cuda:N" with distinct N (ProcessGroupNCCL, one GPU a rank). The groups are set up
// together, each on its own thread, since each waits for all the others.
std::vector<std::shared_ptr<GradientReducer>> local_reducers(
    const std::vector<std::string>& devices, std::chrono::milliseconds timeout = std::chrono::minutes(5));

}  // namespace kernelrl

// The sampler's generation engine: prompts in, one token at a time out to a sink, over a model's
// key-value cache. Includes torch (through model.hpp): policy/ sources only.
//
// Rows. The cache has a row per sequence being decoded (at most max_rows); a
// sequence finished by its sink frees its row for the next waiting one (continuous batching).
// Each row's prompt sits at slots [0, length) (no padding), so a token's position is its slot.
// Prompts are prefilled once each and their keys copied to every row that samples from them (a
// GRPO group of n samples shares one prefill); on the fused path the rows of one prompt's samples
// then read its keys from one of them, so that the group's attention reads one copy from memory
// (KERNELRL_SHARED_PREFIX=0: each its own; the same bits either way).
//
// Steps. On CUDA with a bf16 model of a supported shape, a decode step is the fused kernels of
// cuda_kernels.hpp (one GEMM per projection group, attention over each row's own length, the
// token drawn on the device); otherwise LibTorch ops. On CUDA each step is the replay of a CUDA
// graph captured per bucket of key length, and the host reads the drawn tokens a window of steps
// behind the device, so the GPU never waits for it. Environment: KERNELRL_CUDA_GRAPHS=0 (op by op),
// KERNELRL_CUDA_GRAPHS=static (the graph's fixed-shape step op by op, any device), KERNELRL_FUSED=0
// (LibTorch ops on CUDA too).
#pragma once

#include "policy/model.hpp"
#include "policy/policy.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kernelrl {

// Receives every generated token of sequence `seq` (prompt seq / n) in order with its logprob;
// returns true once the sequence is finished (eos, a stop string, its length limit).
using TokenSink = std::function<bool(int64_t seq, int32_t token, float logprob)>;

using DecodeStats = GenerationStats;

class Decoder {
 public:
  explicit Decoder(CausalLM& model);
  ~Decoder();
  // Samples s.n sequences of every prompt (token ids within the vocabulary, none empty) with
  // s's temperature, top_p, max_tokens and seed (stop strings are the sink's), at most max_rows at
  // once (0: all).
  void generate(const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& s, int64_t max_rows,
                const TokenSink& sink);
  const DecodeStats& stats() const { return stats_; }

 private:
  struct Run;
  CausalLM& m_;
  DecodeStats stats_;
};

}  // namespace kernelrl

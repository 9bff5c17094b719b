// LoRA training for the learner: gradients of the GRPO loss accumulated over minibatches as they
// arrive (streaming), then one optimizer step. Accumulation keeps sums and normalises at step time
// (by the step's token count for token_mean, its sequence count for seq_mean), so any split of a
// step's batch into minibatches gives the same update as the whole batch at once.
// Includes torch: learner/ only.
#pragma once

#include "learner/grpo.hpp"
#include "learner/model.hpp"

#include <memory>

namespace kernelrl {

struct TrainOptions {
  double learning_rate = 1e-5;  // AdamW
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, adam_eps = 1e-8;
  double max_grad_norm = 1.0;   // total L2 norm of the LoRA gradients is clipped to this (0: off)
  LossOptions loss;
};

// One minibatch: sequences of prompt + completion, right-padded.
struct TrainBatch {
  torch::Tensor ids;         // int64 [B, L]
  torch::Tensor mask;        // [B, L]: 1 where ids[:, t] is a completion token that counts
  torch::Tensor old_logp;    // [B, L]: rollout logprob of ids[:, t] (position 0 unused)
  torch::Tensor advantages;  // [B] per sequence, or [B, L] per token
  torch::Tensor ref_logp;    // [B, L] reference logprobs, or undefined
};

struct StepReport {
  double loss = 0;       // the step's aggregated loss
  double grad_norm = 0;  // before clipping
  double tokens = 0, sequences = 0;
};

class LoraTrainer {
 public:
  LoraTrainer(CausalLM& model, const TrainOptions& o);
  // Forward and backward of one minibatch; gradients accumulate until step().
  void accumulate(const TrainBatch& b);
  // Normalises the accumulated gradients, clips, takes one AdamW step, clears them.
  StepReport step();

 private:
  CausalLM& model_;
  TrainOptions o_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<torch::optim::AdamW> opt_;
  double loss_sum_ = 0, tokens_ = 0, sequences_ = 0;
};

}  // namespace kernelrl

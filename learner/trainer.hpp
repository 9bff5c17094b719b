// LoRA training for the learner: gradients of the GRPO loss (or of SFT's cross-entropy)
// accumulated over minibatches as they arrive (streaming), then one optimizer step. Accumulation
// keeps sums and normalises at step time (by the step's token count for token_mean, its sequence
// count for seq_mean), so any split of a step's batch into minibatches gives the same update as
// the whole batch at once. Includes torch: learner/ only.
#pragma once

#include "learner/grpo.hpp"
#include "policy/model.hpp"

#include <memory>
#include <string>

namespace kernelrl {

struct TrainOptions {
  double learning_rate = 1e-5;  // AdamW peak learning rate
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, adam_eps = 1e-8;
  double max_grad_norm = 1.0;  // total L2 norm of the LoRA gradients is clipped to this (0: off)
  // Learning-rate schedule over `total_steps` optimizer steps: constant, linear (to 0) or cosine
  // (to 0), each after `warmup_steps` of linear warmup from 0 (transformers' conventions: step k
  // of the warmup uses peak * k / warmup_steps).
  std::string schedule = "constant";
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;                // 0: unknown (linear and cosine then stay at the peak)
  double temperature = 1.0;               // logprobs are log softmax(logits / T): the sampler's temperature
  bool activation_checkpointing = false;  // CausalLM::set_checkpointing for the training passes
  LossOptions loss;
};

// The learning rate of optimizer step `step` (0-based) under `o`'s schedule.
double scheduled_lr(const TrainOptions& o, int64_t step);

// One minibatch: sequences of prompt + completion, right-padded.
struct TrainBatch {
  torch::Tensor ids;         // int64 [B, L]
  torch::Tensor mask;        // [B, L]: 1 where ids[:, t] is a completion token that counts
  torch::Tensor old_logp;    // [B, L]: rollout logprob of ids[:, t] (position 0 unused)
  torch::Tensor advantages;  // [B] per sequence, or [B, L] per token
  torch::Tensor ref_logp;    // [B, L] reference logprobs, or undefined (then, with kl_coef > 0,
                             // the base model's: the adapter switched off)
};

struct StepReport {
  double loss = 0;       // the step's aggregated loss
  double grad_norm = 0;  // before clipping
  double tokens = 0, sequences = 0;
  double lr = 0;  // learning rate used
  // Token means over the step (GRPO steps; 0 for SFT): the policy-gradient term, k3 KL to the
  // reference, share of tokens whose clipped term was taken, importance ratio, entropy.
  double pg = 0, kl = 0, clip_fraction = 0, ratio_mean = 0, entropy = 0;
  // Mismatch rejection sampling (LossOptions::mismatch): tokens it left out, and sequences it left
  // without any token.
  double mismatch_tokens = 0, mismatch_sequences = 0;
};

class GradientReducer;  // learner/data_parallel.hpp

class LoraTrainer {
 public:
  LoraTrainer(CausalLM& model, const TrainOptions& o);
  // Forward and backward of one minibatch; gradients accumulate until step().
  void accumulate(const TrainBatch& b);
  // Supervised fine-tuning: cross-entropy of ids[:, t] where mask[:, t] is 1 (token_mean over the step).
  void accumulate_sft(const torch::Tensor& ids, const torch::Tensor& mask);
  // Normalises the accumulated gradients, clips, takes one AdamW step at the scheduled learning
  // rate, clears them.
  StepReport step();
  int64_t steps_done() const { return steps_; }
  // Data-parallel: step() first sums the gradients and statistics of every rank (each rank having
  // accumulated its share of the step's sequences, possibly none), so all ranks take the step that
  // one trainer would take on the whole batch. Every rank must call step() for every step. (A LoRA
  // tensor that no rank computed a gradient for steps with a zero one, where a single trainer would
  // skip it; every adapter tensor is in every forward pass, so a step with data has them all.)
  void set_reducer(std::shared_ptr<GradientReducer> r) { reducer_ = std::move(r); }
  bool pending() const { return stats_.defined(); }

  // Optimizer state (AdamW moments and step counts per LoRA tensor, the step counter) as one
  // safetensors file; load_state() restores it onto the same adapter layout.
  void save_state(const std::string& path) const;
  void load_state(const std::string& path);

 private:
  CausalLM& model_;
  TrainOptions o_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<torch::optim::AdamW> opt_;
  int64_t steps_ = 0;
  bool sft_ = false;
  double sequences_ = 0;
  // Device-side sums since the last step: loss, tokens, pg, k3, clipped tokens, ratio, entropy.
  torch::Tensor stats_;
  std::shared_ptr<GradientReducer> reducer_;
  void reduce_ranks();
};

}  // namespace kernelrl

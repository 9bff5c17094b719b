// The policy-gradient loss of GRPO-family updates (learner/ only: includes torch).
//
// Per token t of sequence i, with logprob l under the policy being trained, l_old under the policy
// that sampled it, advantage A (per sequence, or per token for SDPO) and mask m:
//   ratio = exp(l - l_old)
//   pg    = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))
//   kl    = exp(l_ref - l) - (l_ref - l) - 1            (k3 estimator of KL(policy || reference))
//   per-token loss = pg + kl_coef * kl - entropy_coef * H   (H: the policy's entropy at t)
// aggregated as token_mean (sum over all unmasked tokens / their count) or seq_mean (each
// sequence's token mean, then the mean over sequences).
#pragma once

#include <torch/torch.h>

#include <string>

namespace kernelrl {

struct LossOptions {
  double clip_low = 0.2;                   // PPO clip below 1
  double clip_high = 0.2;                  // PPO clip above 1 (DAPO's clip-higher: e.g. 0.28)
  std::string aggregation = "token_mean";  // token_mean or seq_mean
  double kl_coef = 0;                      // weight of the k3 KL to the reference policy (0: none)
  double entropy_coef = 0;                 // weight of the entropy bonus (0: none)
  // Mismatch rejection sampling: tokens (or whole sequences) whose logprob under the policy being
  // trained and under the sampler that drew them disagree by more than mismatch_threshold in |log
  // ratio| (a sequence: the mean over its tokens) leave the loss, as if masked. "off", "token" or
  // "sequence" (LoraTrainer::accumulate applies it and counts what it dropped).
  std::string mismatch = "off";
  double mismatch_threshold = 0.5;
};

// The mask of mismatch rejection sampling: `mask` [B, T] with the tokens (mode "token") or the
// sequences (mode "sequence": the mean of log(ratio) over the sequence's masked tokens) whose
// |logp - old_logp| exceeds `threshold` set to 0; `mask` itself for mode "off".
torch::Tensor mismatch_mask(const torch::Tensor& logp, const torch::Tensor& old_logp, const torch::Tensor& mask,
                            const std::string& mode, double threshold);

struct LossResult {
  torch::Tensor loss;        // scalar, differentiable in logp
  double pg = 0;             // the policy-gradient term (aggregated like the loss)
  double kl = 0;             // mean k3 over unmasked tokens (0 without a reference)
  double clip_fraction = 0;  // unmasked tokens where the clipped term was taken
  double ratio_mean = 0;     // mean ratio over unmasked tokens
  double entropy = 0;        // mean entropy over unmasked tokens (when given)
};

// The per-token pieces, computed once for the loss and for what is reported.
struct LossTerms {
  torch::Tensor ratio, unclipped, clipped, pg;  // [B, T]; pg = max(unclipped, clipped)
  torch::Tensor k3;                             // [B, T], undefined without a reference
  torch::Tensor per_token;                      // pg + kl_coef * k3 - entropy_coef * entropy
};
// `entropy` [B, T] (differentiable for a bonus) or undefined.
LossTerms loss_terms(const torch::Tensor& logp, const torch::Tensor& old_logp, const torch::Tensor& advantages,
                     const torch::Tensor& ref_logp, const LossOptions& o, const torch::Tensor& entropy = {});

// The per-token loss [B, T] before masking and aggregation (pg + kl_coef * k3).
torch::Tensor per_token_loss(const torch::Tensor& logp, const torch::Tensor& old_logp, const torch::Tensor& advantages,
                             const torch::Tensor& ref_logp, const LossOptions& o);

// logp, old_logp, mask: [B, T]; advantages: [B] (per sequence) or [B, T] (per token);
// ref_logp: [B, T] or undefined; entropy: [B, T] or undefined (reported only).
LossResult policy_loss(const torch::Tensor& logp, const torch::Tensor& old_logp, const torch::Tensor& advantages,
                       const torch::Tensor& mask, const torch::Tensor& ref_logp, const torch::Tensor& entropy,
                       const LossOptions& o);

}  // namespace kernelrl

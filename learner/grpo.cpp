#include "learner/grpo.hpp"

#include <stdexcept>

namespace kernelrl {

namespace {
torch::Tensor aggregate(const torch::Tensor& per_token, const torch::Tensor& m, const std::string& how) {
  if (how == "token_mean") return (per_token * m).sum() / m.sum().clamp_min(1);
  if (how == "seq_mean") return ((per_token * m).sum(1) / m.sum(1).clamp_min(1)).mean();
  throw std::invalid_argument("loss: aggregation \"" + how + "\" (expected token_mean or seq_mean)");
}

}  // namespace

LossTerms loss_terms(const torch::Tensor& logp, const torch::Tensor& old_logp, const torch::Tensor& advantages,
                     const torch::Tensor& ref_logp, const LossOptions& o, const torch::Tensor& entropy) {
  auto adv = advantages.dim() == 1 ? advantages.unsqueeze(1).expand_as(logp) : advantages;
  if (adv.sizes() != logp.sizes()) throw std::invalid_argument("loss: advantages must be [B] or [B, T]");
  LossTerms t;
  t.ratio = torch::exp(logp - old_logp);
  t.unclipped = -adv * t.ratio;
  t.clipped = -adv * torch::clamp(t.ratio, 1.0 - o.clip_low, 1.0 + o.clip_high);
  t.pg = torch::maximum(t.unclipped, t.clipped);
  if (ref_logp.defined()) {
    auto d = ref_logp - logp;
    t.k3 = torch::exp(d) - d - 1;
  }
  t.per_token = t.k3.defined() && o.kl_coef != 0 ? t.pg + o.kl_coef * t.k3 : t.pg;
  if (entropy.defined() && o.entropy_coef != 0) t.per_token = t.per_token - o.entropy_coef * entropy;
  return t;
}

torch::Tensor mismatch_mask(const torch::Tensor& logp, const torch::Tensor& old_logp, const torch::Tensor& mask,
                            const std::string& mode, double threshold) {
  if (mode == "off") return mask;
  torch::NoGradGuard ng;
  auto d = logp.detach() - old_logp;
  if (mode == "token") return mask * (d.abs() <= threshold).to(mask.scalar_type());
  if (mode == "sequence") {
    auto mean = (d * mask).sum(1) / mask.sum(1).clamp_min(1);
    return mask * (mean.abs() <= threshold).to(mask.scalar_type()).unsqueeze(1);
  }
  throw std::invalid_argument("loss: mismatch \"" + mode + "\" (expected off, token or sequence)");
}

torch::Tensor per_token_loss(const torch::Tensor& logp, const torch::Tensor& old_logp, const torch::Tensor& advantages,
                             const torch::Tensor& ref_logp, const LossOptions& o) {
  return loss_terms(logp, old_logp, advantages, ref_logp, o).per_token;
}

LossResult policy_loss(const torch::Tensor& logp, const torch::Tensor& old_logp, const torch::Tensor& advantages,
                       const torch::Tensor& mask, const torch::Tensor& ref_logp, const torch::Tensor& entropy,
                       const LossOptions& o) {
  if (logp.sizes() != old_logp.sizes() || logp.sizes() != mask.sizes())
    throw std::invalid_argument("loss: logp, old_logp and mask must have the same shape [B, T]");
  auto m = mask.to(logp.scalar_type());
  const LossTerms t = loss_terms(logp, old_logp, advantages, ref_logp, o, entropy);
  const auto& pg = t.pg;
  const auto& per_token = t.per_token;
  LossResult r;
  const double n = std::max(1.0, m.sum().item<double>());
  if (t.k3.defined()) r.kl = ((t.k3 * m).sum().item<double>()) / n;
  r.loss = aggregate(per_token, m, o.aggregation);
  r.pg = aggregate(pg, m, o.aggregation).item<double>();
  r.clip_fraction = (((t.clipped > t.unclipped).to(m.scalar_type()) * m).sum().item<double>()) / n;
  r.ratio_mean = ((t.ratio * m).sum().item<double>()) / n;
  if (entropy.defined()) r.entropy = ((entropy * m).sum().item<double>()) / n;
  return r;
}

}  // namespace kernelrl

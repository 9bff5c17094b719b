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

torch::Tensor per_token_loss(const torch::Tensor& logp, const torch::Tensor& old_logp, const torch::Tensor& advantages,
                             const torch::Tensor& ref_logp, const LossOptions& o) {
  auto adv = advantages.dim() == 1 ? advantages.unsqueeze(1).expand_as(logp) : advantages;
  auto ratio = torch::exp(logp - old_logp);
  auto pg = torch::maximum(-adv * ratio, -adv * torch::clamp(ratio, 1.0 - o.clip_low, 1.0 + o.clip_high));
  if (!ref_logp.defined() || o.kl_coef == 0) return pg;
  auto d = ref_logp - logp;
  return pg + o.kl_coef * (torch::exp(d) - d - 1);
}

LossResult policy_loss(const torch::Tensor& logp, const torch::Tensor& old_logp, const torch::Tensor& advantages,
                       const torch::Tensor& mask, const torch::Tensor& ref_logp, const torch::Tensor& entropy,
                       const LossOptions& o) {
  if (logp.sizes() != old_logp.sizes() || logp.sizes() != mask.sizes())
    throw std::invalid_argument("loss: logp, old_logp and mask must have the same shape [B, T]");
  auto m = mask.to(logp.scalar_type());
  auto adv = advantages.dim() == 1 ? advantages.unsqueeze(1).expand_as(logp) : advantages;
  if (adv.sizes() != logp.sizes()) throw std::invalid_argument("loss: advantages must be [B] or [B, T]");
  auto ratio = torch::exp(logp - old_logp);
  auto unclipped = -adv * ratio;
  auto clipped = -adv * torch::clamp(ratio, 1.0 - o.clip_low, 1.0 + o.clip_high);
  auto pg = torch::maximum(unclipped, clipped);
  auto per_token = pg;
  LossResult r;
  const double n = std::max(1.0, m.sum().item<double>());
  if (ref_logp.defined()) {
    auto d = ref_logp - logp;
    auto k3 = torch::exp(d) - d - 1;
    r.kl = ((k3 * m).sum().item<double>()) / n;
    if (o.kl_coef != 0) per_token = per_token + o.kl_coef * k3;
  }
  r.loss = aggregate(per_token, m, o.aggregation);
  r.pg = aggregate(pg, m, o.aggregation).item<double>();
  r.clip_fraction = (((clipped > unclipped).to(m.scalar_type()) * m).sum().item<double>()) / n;
  r.ratio_mean = ((ratio * m).sum().item<double>()) / n;
  if (entropy.defined()) r.entropy = ((entropy * m).sum().item<double>()) / n;
  return r;
}

}  // namespace kernelrl

#include "learner/trainer.hpp"

#include <stdexcept>

namespace kernelrl {

LoraTrainer::LoraTrainer(CausalLM& model, const TrainOptions& o) : model_(model), o_(o) {
  if (!model.has_lora()) throw std::invalid_argument("trainer: the model has no LoRA adapter to train");
  for (auto& [name, t] : model.lora_tensors()) {
    t.requires_grad_(true);
    params_.push_back(t);
  }
  auto ao = torch::optim::AdamWOptions(o.learning_rate)
                .betas({o.beta1, o.beta2})
                .eps(o.adam_eps)
                .weight_decay(o.weight_decay);
  opt_ = std::make_unique<torch::optim::AdamW>(params_, ao);
  opt_->zero_grad();
}

void LoraTrainer::accumulate(const TrainBatch& b) {
  const int64_t B = b.ids.size(0), L = b.ids.size(1);
  auto dev = model_.device();
  auto lp = model_.sequence_logprobs(b.ids, /*training=*/true);
  auto m = b.mask.to(dev, torch::kFloat32).narrow(1, 1, L - 1);
  auto old = b.old_logp.to(dev, torch::kFloat32).narrow(1, 1, L - 1);
  auto adv = b.advantages.to(dev, torch::kFloat32);
  if (adv.dim() == 2) adv = adv.narrow(1, 1, L - 1);
  torch::Tensor ref;
  if (b.ref_logp.defined()) ref = b.ref_logp.to(dev, torch::kFloat32).narrow(1, 1, L - 1);
  auto tok = per_token_loss(lp, old, adv, ref, o_.loss) * m;
  torch::Tensor sum;
  if (o_.loss.aggregation == "token_mean") sum = tok.sum();
  else if (o_.loss.aggregation == "seq_mean") sum = (tok.sum(1) / m.sum(1).clamp_min(1)).sum();
  else throw std::invalid_argument("trainer: aggregation \"" + o_.loss.aggregation + "\"");
  sum.backward();
  loss_sum_ += sum.item<double>();
  tokens_ += m.sum().item<double>();
  sequences_ += double(B);
}

StepReport LoraTrainer::step() {
  StepReport r;
  r.tokens = tokens_;
  r.sequences = sequences_;
  const double norm = o_.loss.aggregation == "token_mean" ? tokens_ : sequences_;
  if (norm <= 0) throw std::runtime_error("trainer: step without any accumulated tokens");
  r.loss = loss_sum_ / norm;
  torch::NoGradGuard ng;
  double sq = 0;
  for (auto& p : params_)
    if (p.grad().defined()) {
      p.mutable_grad().div_(norm);
      sq += p.grad().pow(2).sum().item<double>();
    }
  r.grad_norm = std::sqrt(sq);
  if (o_.max_grad_norm > 0 && r.grad_norm > o_.max_grad_norm) {
    const double s = o_.max_grad_norm / (r.grad_norm + 1e-6);
    for (auto& p : params_)
      if (p.grad().defined()) p.mutable_grad().mul_(s);
  }
  opt_->step();
  opt_->zero_grad();
  loss_sum_ = tokens_ = sequences_ = 0;
  return r;
}

}  // namespace kernelrl

#include "learner/trainer.hpp"

#include "learner/data_parallel.hpp"
#include "policy/safetensors.hpp"

#include <cmath>
#include <stdexcept>

namespace kernelrl {

double scheduled_lr(const TrainOptions& o, int64_t step) {
  // The conventions of transformers' get_{constant,linear,cosine}_schedule_with_warmup.
  const double peak = o.learning_rate;
  if (o.schedule != "constant" && o.schedule != "linear" && o.schedule != "cosine")
    throw std::invalid_argument("trainer: schedule \"" + o.schedule + "\" (expected constant, linear or cosine)");
  if (step < o.warmup_steps) return peak * double(step) / double(std::max<int64_t>(1, o.warmup_steps));
  if (o.schedule == "constant" || o.total_steps <= 0) return peak;
  const double span = double(std::max<int64_t>(1, o.total_steps - o.warmup_steps));
  if (o.schedule == "linear") return peak * std::max(0.0, double(o.total_steps - step) / span);
  const double progress = double(step - o.warmup_steps) / span;
  return peak * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
}

LoraTrainer::LoraTrainer(CausalLM& model, const TrainOptions& o) : model_(model), o_(o) {
  if (!model.has_lora()) throw std::invalid_argument("trainer: the model has no LoRA adapter to train");
  if (o.loss.aggregation != "token_mean" && o.loss.aggregation != "seq_mean")
    throw std::invalid_argument("trainer: aggregation \"" + o.loss.aggregation +
                                "\" (expected token_mean or seq_mean)");
  for (auto& [name, t] : model.lora_tensors()) {
    t.requires_grad_(true);
    names_.push_back(name);
    params_.push_back(t);
  }
  auto ao = torch::optim::AdamWOptions(o.learning_rate)
                .betas({o.beta1, o.beta2})
                .eps(o.adam_eps)
                .weight_decay(o.weight_decay);
  opt_ = std::make_unique<torch::optim::AdamW>(params_, ao);
  opt_->zero_grad();
  model_.set_checkpointing(o.activation_checkpointing);
}

// The sums a step accumulates: loss, tokens, pg, k3, clipped tokens, ratio, entropy, tokens and
// sequences left out by mismatch rejection sampling.
constexpr int64_t kStats = 9;

void LoraTrainer::accumulate(const TrainBatch& b) {
  if (sft_ && sequences_ > 0) throw std::logic_error("trainer: GRPO and SFT minibatches mixed in one step");
  sft_ = false;
  const int64_t B = b.ids.size(0), L = b.ids.size(1);
  auto dev = model_.device();
  torch::Tensor ref;
  if (b.ref_logp.defined()) {
    ref = b.ref_logp.to(dev, torch::kFloat32).narrow(1, 1, L - 1);
  } else if (o_.loss.kl_coef != 0) {  // the reference policy: the base model, adapter off
    torch::NoGradGuard ng;
    model_.set_lora_enabled(false);
    try {
      ref = model_.sequence_logprobs(b.ids, /*training=*/false, o_.temperature);
    } catch (...) {
      model_.set_lora_enabled(true);
      throw;
    }
    model_.set_lora_enabled(true);
  }
  torch::Tensor ent;
  auto lp = model_.sequence_logprobs(b.ids, /*training=*/true, o_.temperature, &ent, o_.loss.entropy_coef != 0);
  auto m0 = b.mask.to(dev, torch::kFloat32).narrow(1, 1, L - 1);
  auto old = b.old_logp.to(dev, torch::kFloat32).narrow(1, 1, L - 1);
  // Mismatch rejection sampling: what it leaves out is counted (tokens, and sequences left empty).
  auto m = mismatch_mask(lp, old, m0, o_.loss.mismatch, o_.loss.mismatch_threshold);
  auto adv = b.advantages.to(dev, torch::kFloat32);
  if (adv.dim() == 2) adv = adv.narrow(1, 1, L - 1);
  const LossTerms t = loss_terms(lp, old, adv, ref, o_.loss, ent);
  auto tok = t.per_token * m;
  torch::Tensor sum;
  if (o_.loss.aggregation == "token_mean")
    sum = tok.sum();
  else
    sum = (tok.sum(1) / m.sum(1).clamp_min(1)).sum();
  sum.backward();
  // What is reported, summed on the device: nothing here waits for the GPU (one sync per step).
  torch::NoGradGuard ng;
  auto pg = t.pg.detach() * m;
  auto pg_sum = o_.loss.aggregation == "token_mean" ? pg.sum() : (pg.sum(1) / m.sum(1).clamp_min(1)).sum();
  auto kl = t.k3.defined() ? (t.k3.detach() * m).sum() : torch::zeros({}, m.options());
  auto dropped = (m0 - m).sum();
  auto dropped_seqs = ((m0.sum(1) > 0) & (m.sum(1) == 0)).to(m.scalar_type()).sum();
  auto stats =
      torch::stack({sum.detach(), m.sum(), pg_sum, kl, ((t.clipped > t.unclipped).to(m.scalar_type()) * m).sum(),
                    (t.ratio.detach() * m).sum(),
                    ent.defined() ? (ent.detach() * m).sum() : torch::zeros({}, m.options()), dropped, dropped_seqs});
  stats_ = stats_.defined() ? stats_ + stats : stats;
  sequences_ += double(B);
}

void LoraTrainer::accumulate_sft(const torch::Tensor& ids, const torch::Tensor& mask) {
  if (!sft_ && sequences_ > 0) throw std::logic_error("trainer: GRPO and SFT minibatches mixed in one step");
  sft_ = true;
  const int64_t L = ids.size(1);
  auto lp = model_.sequence_logprobs(ids, /*training=*/true, 1.0);
  auto m = mask.to(model_.device(), torch::kFloat32).narrow(1, 1, L - 1);
  auto sum = -(lp * m).sum();
  sum.backward();
  torch::NoGradGuard ng;
  auto z = torch::zeros({}, m.options());
  auto stats = torch::stack({sum.detach(), m.sum(), z, z, z, z, z, z, z});
  stats_ = stats_.defined() ? stats_ + stats : stats;
  sequences_ += double(ids.size(0));
}

// One all-reduce over the ranks of [the step's sums (7), sequences, ranks in SFT, ranks in GRPO,
// every LoRA gradient]: afterwards this rank holds the whole step's sums and gradients.
void LoraTrainer::reduce_ranks() {
  torch::NoGradGuard ng;
  auto f32 = params_.front().options().dtype(torch::kFloat32);
  const bool has = stats_.defined();
  std::vector<torch::Tensor> parts{has ? stats_.to(torch::kFloat32) : torch::zeros({kStats}, f32),
                                   torch::tensor({sequences_, has && sft_ ? 1.0 : 0.0, has && !sft_ ? 1.0 : 0.0},
                                                 torch::TensorOptions().dtype(torch::kFloat32))
                                       .to(f32.device())};
  for (auto& p : params_)
    parts.push_back(p.grad().defined() ? p.grad().reshape(-1).to(torch::kFloat32) : torch::zeros({p.numel()}, f32));
  auto flat = torch::cat(parts);
  reducer_->sum(flat);
  auto head = flat.narrow(0, kStats, 3).to(torch::kCPU, torch::kFloat64);
  const double sequences = head[0].item<double>(), sft_ranks = head[1].item<double>(),
               grpo_ranks = head[2].item<double>();
  if (sft_ranks > 0 && grpo_ranks > 0)
    throw std::logic_error("trainer: GRPO and SFT minibatches mixed in one data-parallel step");
  if (sequences <= 0) throw std::runtime_error("trainer: step without any accumulated tokens (on any rank)");
  stats_ = flat.narrow(0, 0, kStats).clone();
  sequences_ = sequences;
  sft_ = sft_ranks > 0;
  int64_t off = kStats + 3;
  for (auto& p : params_) {
    auto g = flat.narrow(0, off, p.numel()).view(p.sizes()).to(p.scalar_type());
    off += p.numel();
    if (p.grad().defined())
      p.mutable_grad().copy_(g);
    else
      p.mutable_grad() = g.clone();
  }
}

StepReport LoraTrainer::step() {
  StepReport r;
  if (reducer_ && reducer_->size() > 1) reduce_ranks();
  if (!stats_.defined()) throw std::runtime_error("trainer: step without any accumulated tokens");
  torch::NoGradGuard ng;
  std::vector<torch::Tensor> sq;
  for (auto& p : params_)
    if (p.grad().defined()) sq.push_back(p.grad().pow(2).sum());
  // One transfer: the step's sums and the squared gradient norm before normalisation.
  auto host =
      torch::cat({stats_, sq.empty() ? torch::zeros({1}, stats_.options()) : torch::stack(sq).sum().reshape({1})})
          .to(torch::kCPU, torch::kFloat64);
  auto h = host.accessor<double, 1>();
  const double loss_sum = h[0], tokens = h[1];
  r.tokens = tokens;
  r.sequences = sequences_;
  const double norm = (sft_ || o_.loss.aggregation == "token_mean") ? tokens : sequences_;
  if (norm <= 0) throw std::runtime_error("trainer: step without any accumulated tokens");
  r.loss = loss_sum / norm;
  if (!sft_ && tokens > 0) {
    r.pg = h[2] / norm;
    r.kl = h[3] / tokens;
    r.clip_fraction = h[4] / tokens;
    r.ratio_mean = h[5] / tokens;
    r.entropy = h[6] / tokens;
  }
  if (!sft_) {
    r.mismatch_tokens = h[7];
    r.mismatch_sequences = h[8];
  }
  r.grad_norm = std::sqrt(h[kStats]) / norm;
  double scale = 1.0 / norm;
  if (o_.max_grad_norm > 0 && r.grad_norm > o_.max_grad_norm) scale *= o_.max_grad_norm / (r.grad_norm + 1e-6);
  for (auto& p : params_)
    if (p.grad().defined()) p.mutable_grad().mul_(scale);
  r.lr = scheduled_lr(o_, steps_);
  for (auto& g : opt_->param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(r.lr);
  opt_->step();
  opt_->zero_grad();
  ++steps_;
  stats_ = torch::Tensor();
  sequences_ = 0;
  sft_ = false;
  return r;
}

void LoraTrainer::save_state(const std::string& path) const {
  std::map<std::string, torch::Tensor> ts;
  auto& state = opt_->state();
  for (size_t i = 0; i < params_.size(); ++i) {
    auto it = state.find(params_[i].unsafeGetTensorImpl());
    if (it == state.end()) continue;
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    ts[names_[i] + ".exp_avg"] = s.exp_avg();
    ts[names_[i] + ".exp_avg_sq"] = s.exp_avg_sq();
    ts[names_[i] + ".step"] = torch::tensor({s.step()}, torch::kInt64);
  }
  ts["trainer.steps"] = torch::tensor({steps_}, torch::kInt64);
  save_tensors(path, ts, std::nullopt, {{"format", "kernelrl-adamw"}});
}

void LoraTrainer::load_state(const std::string& path) {
  auto f = SafetensorsFile::open(path);
  auto get = [&](const std::string& name) -> const StTensorView* {
    for (auto& v : f->tensors())
      if (v.name == name) return &v;
    return nullptr;
  };
  auto to_tensor = [&](const StTensorView& v, torch::ScalarType want) {
    auto dt = v.dtype == StDtype::F32 ? torch::kFloat32 : v.dtype == StDtype::I64 ? torch::kInt64 : torch::kFloat64;
    if (dt != want) throw std::runtime_error(path + ": " + v.name + ": unexpected dtype");
    return torch::from_blob(const_cast<uint8_t*>(v.data), v.shape, torch::TensorOptions().dtype(dt)).clone();
  };
  auto* st = get("trainer.steps");
  if (!st) throw std::runtime_error(path + ": not a kernelrl optimizer state (no trainer.steps)");
  steps_ = to_tensor(*st, torch::kInt64).item<int64_t>();
  auto& state = opt_->state();
  for (size_t i = 0; i < params_.size(); ++i) {
    auto* m1 = get(names_[i] + ".exp_avg");
    auto* m2 = get(names_[i] + ".exp_avg_sq");
    auto* sp = get(names_[i] + ".step");
    if (!m1 && !m2 && !sp) continue;  // never stepped
    if (!m1 || !m2 || !sp) throw std::runtime_error(path + ": incomplete optimizer state for " + names_[i]);
    auto a = to_tensor(*m1, torch::kFloat32), b = to_tensor(*m2, torch::kFloat32);
    if (a.sizes() != params_[i].sizes() || b.sizes() != params_[i].sizes())
      throw std::runtime_error(path + ": " + names_[i] + ": optimizer state shape differs from the adapter's");
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(to_tensor(*sp, torch::kInt64).item<int64_t>());
    s->exp_avg(a.to(params_[i].device()));
    s->exp_avg_sq(b.to(params_[i].device()));
    state[params_[i].unsafeGetTensorImpl()] = std::move(s);
  }
}

}  // namespace kernelrl

#include "learner/lora_learner.hpp"

#include "core/files.hpp"

#include "core/paths.hpp"
#include "learner/objective.hpp"
#include "policy/model.hpp"
#include "policy/tokenizer.hpp"
#include "learner/trainer.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace kernelrl {

namespace {
TrainOptions train_options(const LearnerOptions& o) {
  TrainOptions to;
  to.learning_rate = o.learner.learning_rate;
  to.weight_decay = o.learner.weight_decay;
  to.max_grad_norm = o.learner.max_grad_norm;
  to.schedule = o.learner.lr_schedule;
  to.warmup_steps = o.learner.warmup_steps;
  to.total_steps = o.learner.steps;
  to.temperature = o.temperature > 0 ? o.temperature : 1.0;
  to.loss.clip_low = o.learner.clip_low;
  to.loss.clip_high = o.learner.clip_high;
  to.loss.kl_coef = o.learner.kl_coef;
  to.loss.entropy_coef = o.learner.entropy_coef;
  to.loss.mismatch = o.learner.mismatch;
  to.loss.mismatch_threshold = o.learner.mismatch_threshold;
  to.loss.aggregation = o.learner.aggregation;
  to.activation_checkpointing = o.learner.activation_checkpointing;
  return to;
}
}  // namespace

struct LoraLearner::Impl {
  LearnerOptions opt;
  std::unique_ptr<Objective> objective;  // the group's advantages (learner/objective.hpp)
  torch::Device device{torch::kCPU};
  std::unique_ptr<CausalLM> model;
  std::shared_ptr<Tokenizer> tok;
  std::unique_ptr<LoraTrainer> trainer;
  uint64_t version = 0;
  bool any_gradient = false;  // since the last step
  double busy_s = 0;          // compute time since the last step

  // prompt + completion rows, right-padded; mask 1 on completion tokens.
  void run_batch(const std::vector<std::vector<int32_t>>& prompts, const std::vector<std::vector<int32_t>>& comps,
                 const std::vector<std::vector<float>>& logps, const std::vector<std::vector<float>>& advs,
                 const std::vector<double>& seq_adv, bool sft) {
    const int64_t B = int64_t(prompts.size());
    int64_t L = 0;
    for (int64_t i = 0; i < B; ++i) L = std::max<int64_t>(L, int64_t(prompts[i].size() + comps[i].size()));
    L = std::max<int64_t>(L, 2);
    auto ids = torch::zeros({B, L}, torch::kInt64);
    auto mask = torch::zeros({B, L}, torch::kFloat32);
    auto old = torch::zeros({B, L}, torch::kFloat32);
    const bool per_token = !advs.empty();
    auto adv = per_token ? torch::zeros({B, L}, torch::kFloat32) : torch::zeros({B}, torch::kFloat32);
    auto ia = ids.accessor<int64_t, 2>();
    auto ma = mask.accessor<float, 2>();
    auto oa = old.accessor<float, 2>();
    for (int64_t i = 0; i < B; ++i) {
      int64_t t = 0;
      for (auto x : prompts[i]) ia[i][t++] = x;
      const int64_t p = t;
      for (size_t j = 0; j < comps[i].size(); ++j, ++t) {
        ia[i][t] = comps[i][j];
        ma[i][t] = p > 0 ? 1.0f : 0.0f;  // the first token of an empty prompt has no context
        if (!sft) oa[i][t] = logps[i][j];
        if (per_token) adv[i][t] = advs[i][j];
      }
      if (!per_token) adv[i] = float(seq_adv.empty() ? 0.0 : seq_adv[i]);
    }
    if (sft)
      trainer->accumulate_sft(ids.to(device), mask);
    else
      trainer->accumulate(TrainBatch{ids.to(device), mask, old, adv, torch::Tensor()});
  }

  // Summed logprobs of each completion after its prompt under the current policy (adapter on,
  // no dropout, no gradient) at the sampler's temperature; one vector per row.
  std::vector<std::vector<float>> score(const std::vector<std::vector<int32_t>>& prompts,
                                        const std::vector<std::vector<int32_t>>& comps) {
    torch::NoGradGuard ng;
    const int64_t B = int64_t(prompts.size());
    int64_t L = 2;
    for (int64_t i = 0; i < B; ++i) L = std::max<int64_t>(L, int64_t(prompts[i].size() + comps[i].size()));
    auto ids = torch::zeros({B, L}, torch::kInt64);
    auto ia = ids.accessor<int64_t, 2>();
    for (int64_t i = 0; i < B; ++i) {
      int64_t t = 0;
      for (auto x : prompts[i]) ia[i][t++] = x;
      for (auto x : comps[i]) ia[i][t++] = x;
    }
    auto lp = model->sequence_logprobs(ids.to(device), /*training=*/false, opt.temperature > 0 ? opt.temperature : 1.0)
                  .to(torch::kCPU, torch::kFloat32)
                  .contiguous();
    auto la = lp.accessor<float, 2>();
    std::vector<std::vector<float>> out(static_cast<size_t>(B));
    for (int64_t i = 0; i < B; ++i) {
      const int64_t p = int64_t(prompts[i].size());
      for (size_t j = 0; j < comps[i].size(); ++j) out[size_t(i)].push_back(la[i][p - 1 + int64_t(j)]);
    }
    return out;
  }
};

LoraLearner::LoraLearner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LoraLearner::~LoraLearner() = default;

std::unique_ptr<LoraLearner> LoraLearner::create(const LearnerOptions& o) {
  auto impl = std::make_unique<Impl>();
  impl->opt = o;
  try {
    if (o.model_dir.empty()) throw LearnerError("learner: no model directory ([policy] model)");
    if (!fs::is_directory(o.model_dir)) throw LearnerError("learner: " + o.model_dir + ": not a directory");
    impl->device = torch::Device(o.learner.device);
    if (impl->device.is_cuda() && !torch::cuda::is_available())
      throw LearnerError("learner: device " + o.learner.device + ": CUDA is not available on this machine");
    impl->model = load_shared_model(o.model_dir, impl->device, parse_dtype(o.learner.dtype), "learner");
    impl->tok = Tokenizer::load(o.model_dir);
    if (!o.adapter_dir.empty()) {
      impl->model->load_lora(o.adapter_dir);
    } else {
      LoraSettings s;
      s.r = o.learner.lora_rank;
      s.alpha = o.learner.lora_alpha;
      s.dropout = o.learner.lora_dropout;
      s.targets = o.learner.lora_targets;
      impl->model->add_lora(s, o.seed);
    }
    TrainOptions to = train_options(o);
    scheduled_lr(to, 0);  // validates the schedule name
    impl->objective = make_objective(o);
    impl->trainer = std::make_unique<LoraTrainer>(*impl->model, to);
  } catch (const LearnerError&) {
    throw;
  } catch (const std::exception& e) {
    throw LearnerError(std::string("learner: ") + e.what());
  }
  return std::unique_ptr<LoraLearner>(new LoraLearner(std::move(impl)));
}

GroupOutcome LoraLearner::add_group(const std::vector<LearnSample>& group) {
  auto& im = *impl_;
  GroupOutcome out = im.objective->plan(group);
  if (out.skipped) return out;
  PolicyScores policy;
  policy.encode = [&im](const std::string& text) { return im.tok->encode(text); };
  policy.score = [&im](const std::vector<std::vector<int32_t>>& prompts,
                       const std::vector<std::vector<int32_t>>& comps) { return im.score(prompts, comps); };
  policy.minibatch = im.opt.learner.minibatch_size;
  double t_scores = mono_s();
  const auto token_adv = im.objective->token_advantages(group, policy, out);
  im.busy_s += mono_s() - t_scores;
  if (out.skipped) return out;
  double t0 = mono_s();
  const size_t mb = std::max<uint32_t>(1, im.opt.learner.minibatch_size);
  for (size_t b0 = 0; b0 < group.size(); b0 += mb) {
    std::vector<std::vector<int32_t>> prompts, comps;
    std::vector<std::vector<float>> logps, advs;
    std::vector<double> seq;
    for (size_t i = b0; i < std::min(group.size(), b0 + mb); ++i) {
      if (group[i].token_ids.empty()) continue;                  // nothing generated: nothing to learn from
      if (!token_adv.empty() && token_adv[i].empty()) continue;  // left out (sdpo: no teacher for it)
      prompts.push_back(im.tok->encode(group[i].prompt));
      comps.push_back(group[i].token_ids);
      logps.push_back(group[i].logprobs);
      if (!token_adv.empty())
        advs.push_back(token_adv[i]);
      else
        seq.push_back(out.advantages[i]);
    }
    if (prompts.empty()) continue;
    try {
      im.run_batch(prompts, comps, logps, advs, seq, false);
    } catch (const std::exception& e) {
      throw LearnerError(std::string("learner: forward/backward failed: ") + e.what());
    }
    im.any_gradient = true;
  }
  im.busy_s += mono_s() - t0;
  return out;
}

namespace {
UpdateStats to_stats(const StepReport& r) {
  UpdateStats u;
  u.loss = r.loss;
  u.grad_norm = r.grad_norm;
  u.lr = r.lr;
  u.tokens = r.tokens;
  u.sequences = r.sequences;
  u.pg = r.pg;
  u.kl = r.kl;
  u.clip_fraction = r.clip_fraction;
  u.ratio_mean = r.ratio_mean;
  u.entropy = r.entropy;
  u.mismatch_tokens = r.mismatch_tokens;
  u.mismatch_sequences = r.mismatch_sequences;
  u.applied = true;
  return u;
}
}  // namespace

UpdateStats LoraLearner::step() { return step(pending()); }

bool LoraLearner::pending() const { return impl_->any_gradient && impl_->trainer->pending(); }

void LoraLearner::set_reducer(std::shared_ptr<GradientReducer> r) { impl_->trainer->set_reducer(std::move(r)); }

UpdateStats LoraLearner::step(bool optimizer) {
  auto& im = *impl_;
  UpdateStats u;
  double t0 = mono_s();
  if (optimizer) {
    try {
      u = to_stats(im.trainer->step());
    } catch (const std::exception& e) {
      throw LearnerError(std::string("learner: optimizer step failed: ") + e.what());
    }
  }
  im.any_gradient = false;
  u.seconds = im.busy_s + (mono_s() - t0);
  im.busy_s = 0;
  u.version = ++im.version;
  return u;
}

UpdateStats LoraLearner::sft_step(const std::vector<std::pair<std::string, std::string>>& demos) {
  auto& im = *impl_;
  double t0 = mono_s();
  auto eos = im.model->config().eos_token_ids;
  const size_t mb = std::max<uint32_t>(1, im.opt.learner.minibatch_size);
  for (size_t b0 = 0; b0 < demos.size(); b0 += mb) {
    std::vector<std::vector<int32_t>> prompts, comps;
    for (size_t i = b0; i < std::min(demos.size(), b0 + mb); ++i) {
      prompts.push_back(im.tok->encode(demos[i].first));
      auto c = im.tok->encode(demos[i].second);
      if (!eos.empty()) c.push_back(eos.front());
      comps.push_back(std::move(c));
    }
    try {
      im.run_batch(prompts, comps, {}, {}, {}, true);
    } catch (const std::exception& e) {
      throw LearnerError(std::string("learner: SFT forward/backward failed: ") + e.what());
    }
  }
  UpdateStats u;
  try {
    u = to_stats(im.trainer->step());
  } catch (const std::exception& e) {
    throw LearnerError(std::string("learner: SFT step failed: ") + e.what());
  }
  u.version = im.version;
  u.seconds = mono_s() - t0;
  return u;
}

uint64_t LoraLearner::version() const { return impl_->version; }

std::vector<TensorBlob> LoraLearner::adapter_blobs() const { return lora_blobs(*impl_->model); }

void LoraLearner::save_checkpoint(const std::string& dir) const {
  auto& im = *impl_;
  const fs::path tmp = fs::path(dir).string() + ".partial";
  try {
    std::string err;
    if (!remove_tree(tmp.string(), err)) throw std::runtime_error(err);
    fs::create_directories(tmp);
    im.model->save_lora(tmp.string(), fs::absolute(im.opt.model_dir).string());
    im.trainer->save_state((tmp / "optimizer.safetensors").string());
    const auto meta = nlohmann::json{{"version", im.version},
                                     {"optimizer_steps", im.trainer->steps_done()},
                                     {"base_model", fs::absolute(im.opt.model_dir).string()}};
    if (!write_file_durably((tmp / "learner.json").string(), meta.dump(2) + "\n", err)) throw std::runtime_error(err);
    // Every file on disk, listed with its size and hash: a step-N folder with a manifest that
    // verifies is complete (core/files.hpp); one without is never taken for a checkpoint.
    if (!write_manifest(tmp.string(), err)) throw std::runtime_error(err);
    if (!remove_tree(dir, err)) throw std::runtime_error(err);
    fs::rename(tmp, dir);  // a checkpoint directory is complete or absent
    if (!sync_path(fs::path(dir).parent_path().string(), err)) throw std::runtime_error(err);
  } catch (const std::exception& e) {
    std::string ignored;
    remove_tree(tmp.string(), ignored);  // what a full disk left of it
    throw LearnerError("learner: cannot write checkpoint " + dir + ": " + e.what());
  }
}

void LoraLearner::load_checkpoint(const std::string& dir) {
  auto& im = *impl_;
  try {
    nlohmann::json j;
    std::ifstream in(fs::path(dir) / "learner.json");
    if (!in) throw std::runtime_error("no learner.json");
    in >> j;
    im.model->load_lora(dir);
    // load_lora made new adapter tensors: the trainer must track those.
    im.trainer.reset();
    im.trainer = std::make_unique<LoraTrainer>(*im.model, train_options(im.opt));
    im.trainer->load_state((fs::path(dir) / "optimizer.safetensors").string());
    im.version = j.at("version").get<uint64_t>();
  } catch (const std::exception& e) {
    throw LearnerError("learner: cannot resume from checkpoint " + dir + ": " + e.what());
  }
}

}  // namespace kernelrl

#include "policy/policy.hpp"

#include "policy/decoder.hpp"
#include "policy/model.hpp"
#include "policy/safetensors.hpp"
#include "policy/tokenizer.hpp"
#include "messages/messages.hpp"

#include <filesystem>
#include <set>

namespace fs = std::filesystem;

namespace kernelrl {

struct Policy::Impl {
  PolicyOptions opt;
  std::unique_ptr<CausalLM> model;
  std::shared_ptr<Tokenizer> tok;
  uint64_t version = 0;
  torch::Device device{torch::kCPU};
  GenerationStats last;  // of the last generate call
};

Policy::Policy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Policy::~Policy() = default;

std::unique_ptr<Policy> Policy::load(const PolicyOptions& o) {
  auto impl = std::make_unique<Impl>();
  impl->opt = o;
  try {
    if (o.model_dir.empty()) throw PolicyError("policy: no model directory given");
    if (!fs::is_directory(o.model_dir)) throw PolicyError(o.model_dir + ": not a directory");
    // "auto" (a run's [policy] device as its config keeps it): a GPU where there is one.
    try {
      impl->device = o.device == "auto" ? (torch::cuda::is_available() ? torch::Device("cuda:0") : torch::Device("cpu"))
                                        : torch::Device(o.device);
    } catch (const c10::Error&) {
      throw PolicyError("device \"" + o.device + "\": expected auto, cpu, cuda or cuda:N");
    }
    if (impl->device.is_cuda() && !torch::cuda::is_available())
      throw PolicyError("device " + o.device + ": CUDA is not available on this machine");
    impl->model = load_shared_model(o.model_dir, impl->device, parse_dtype(o.dtype), "policy");
    impl->tok = Tokenizer::load(o.model_dir);
    if (!o.adapter_dir.empty()) {
      impl->model->load_lora(o.adapter_dir);
    } else if (o.lora_rank > 0) {
      LoraSettings s;
      s.r = o.lora_rank;
      s.alpha = o.lora_alpha;
      s.targets = o.lora_targets;
      impl->model->add_lora(s, o.seed);
    }
  } catch (const PolicyError&) {
    throw;
  } catch (const std::exception& e) {
    throw PolicyError(e.what());
  }
  return std::unique_ptr<Policy>(new Policy(std::move(impl)));
}

const Tokenizer& Policy::tokenizer() const { return *impl_->tok; }
int64_t Policy::vocab_size() const { return impl_->model->config().vocab_size; }
std::vector<int32_t> Policy::eos_token_ids() const { return impl_->model->config().eos_token_ids; }
uint64_t Policy::version() const { return impl_->version; }
bool Policy::has_adapter() const { return impl_->model->has_lora(); }

namespace {

torch::Tensor ids_tensor(const std::vector<int32_t>& ids) {
  return torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kInt64);
}

}  // namespace

std::vector<float> Policy::logits(const std::vector<int32_t>& ids) {
  torch::NoGradGuard ng;
  auto& m = *impl_->model;
  auto x = ids_tensor(ids).to(impl_->device).unsqueeze(0);
  auto pos = torch::arange(int64_t(ids.size()), torch::TensorOptions().dtype(torch::kInt64).device(impl_->device))
                 .unsqueeze(0);
  auto out = m.forward(x, pos, torch::Tensor()).squeeze(0).to(torch::kCPU, torch::kFloat32).contiguous();
  return std::vector<float>(out.data_ptr<float>(), out.data_ptr<float>() + out.numel());
}

std::vector<Completion> Policy::generate(const std::vector<std::string>& prompts, const SamplingParams& p) {
  std::vector<std::vector<int32_t>> ids;
  for (auto& s : prompts) ids.push_back(impl_->tok->encode(s));
  return generate_ids(ids, p);
}

std::vector<Completion> Policy::generate_ids(const std::vector<std::vector<int32_t>>& prompts,
                                             const SamplingParams& p) {
  if (p.temperature < 0) throw PolicyError("sampling: temperature must be >= 0");
  if (p.top_p <= 0 || p.top_p > 1) throw PolicyError("sampling: top_p must be in (0, 1]");
  if (p.n == 0) throw PolicyError("sampling: n must be at least 1");
  std::vector<Completion> out;
  if (prompts.empty()) return out;
  auto& m = *impl_->model;
  const int64_t V = m.config().vocab_size;
  for (auto& pr : prompts) {
    if (pr.empty()) throw PolicyError("sampling: a prompt has no tokens");
    for (auto t : pr)
      if (t < 0 || t >= V)
        throw PolicyError("sampling: prompt token " + std::to_string(t) + " is outside the vocabulary");
  }
  const int64_t B = int64_t(prompts.size()) * p.n;
  out.resize(B);
  for (int64_t b = 0; b < B; ++b) out[b].prompt_tokens = static_cast<uint32_t>(prompts[b / p.n].size());
  if (p.max_tokens == 0) {
    for (auto& c : out) c.finish_reason = "length";
    return out;
  }
  std::set<int32_t> eos(m.config().eos_token_ids.begin(), m.config().eos_token_ids.end());
  std::vector<std::string> bytes(B);
  // Each token as the decoder produces it: eos, stop strings (searched in the new bytes only) and
  // the length limit end a sequence.
  auto sink = [&](int64_t b, int32_t id, float lp) {
    auto& c = out[b];
    c.token_ids.push_back(id);
    c.logprobs.push_back(lp);
    if (eos.count(id)) {
      c.finish_reason = "stop";
    } else {
      if (!(p.skip_special && impl_->tok->is_special(id))) {
        size_t before = bytes[b].size();
        bytes[b] += impl_->tok->token_bytes(id);
        for (auto& s : p.stop) {
          size_t from = before >= s.size() ? before - s.size() + 1 : 0;
          auto at = bytes[b].find(s, from);
          if (!s.empty() && at != std::string::npos) {
            bytes[b].resize(at);
            c.finish_reason = "stop";
            break;
          }
        }
      }
      if (c.finish_reason.empty() && c.token_ids.size() >= p.max_tokens) c.finish_reason = "length";
    }
    return !c.finish_reason.empty();
  };
  Decoder d(m);
  try {
    d.generate(prompts, p, impl_->opt.max_rows, sink);
  } catch (const c10::Error& e) {
    throw PolicyError(std::string("sampling: ") + e.what_without_backtrace());
  }
  impl_->last = d.stats();
  for (int64_t b = 0; b < B; ++b) {
    if (out[b].finish_reason.empty()) out[b].finish_reason = "length";
    out[b].text = utf8_lossy(bytes[b]);
  }
  return out;
}

const GenerationStats& Policy::last_generation() const { return impl_->last; }

std::vector<std::vector<float>> Policy::score_ids(const std::vector<std::vector<int32_t>>& prompts,
                                                  const std::vector<std::vector<int32_t>>& completions,
                                                  double temperature) {
  if (prompts.size() != completions.size()) throw PolicyError("score: prompts and completions differ in number");
  std::vector<std::vector<float>> out(prompts.size());
  if (prompts.empty()) return out;
  torch::NoGradGuard ng;
  auto& m = *impl_->model;
  const auto dev = impl_->device;
  const int64_t V = m.config().vocab_size;
  const double T = temperature > 0 ? temperature : 1.0;
  int64_t L = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) throw PolicyError("score: a prompt has no tokens");
    for (auto* v : {&prompts[i], &completions[i]})
      for (auto t : *v)
        if (t < 0 || t >= V) throw PolicyError("score: token " + std::to_string(t) + " is outside the vocabulary");
    L = std::max<int64_t>(L, prompts[i].size() + completions[i].size());
  }
  const int64_t B = prompts.size();
  // Right padding: causal attention keeps the real tokens from seeing the pads after them.
  std::vector<int64_t> flat(B * L, 0);
  for (int64_t b = 0; b < B; ++b) {
    int64_t k = 0;
    for (auto t : prompts[b]) flat[b * L + k++] = t;
    for (auto t : completions[b]) flat[b * L + k++] = t;
  }
  auto ids = torch::tensor(flat, torch::kInt64).view({B, L}).to(dev);
  auto pos = torch::arange(L, torch::TensorOptions().dtype(torch::kInt64).device(dev)).unsqueeze(0).expand({B, L});
  auto h = m.hidden(ids, pos, torch::Tensor(), nullptr, 0, false);
  for (int64_t b = 0; b < B; ++b) {
    int64_t np = prompts[b].size(), nc = completions[b].size();
    if (nc == 0) continue;
    auto lg = m.lm_head(h[b].narrow(0, np - 1, nc)).to(torch::kFloat32) / T;
    auto tgt = ids[b].narrow(0, np, nc);
    auto lp = torch::log_softmax(lg, -1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1).to(torch::kCPU).contiguous();
    out[b].assign(lp.data_ptr<float>(), lp.data_ptr<float>() + nc);
  }
  return out;
}

Scored Policy::score(const std::string& prompt, const std::string& completion, double temperature) {
  Scored s;
  s.prompt_ids = impl_->tok->encode(prompt);
  s.token_ids = impl_->tok->encode(completion);
  s.logprobs = score_ids({s.prompt_ids}, {s.token_ids}, temperature)[0];
  return s;
}

void Policy::apply_weights(uint64_t version, const std::vector<TensorBlob>& tensors) {
  auto& m = *impl_->model;
  if (!m.has_lora())
    throw PolicyError("weights update " + std::to_string(version) + ": this policy has no adapter to update");
  auto mine = m.lora_tensors();
  std::vector<std::pair<torch::Tensor, torch::Tensor>> todo;
  for (const auto& t : tensors) {
    auto it = mine.find(t.name);
    if (it == mine.end())
      throw PolicyError("weights update " + std::to_string(version) + ": tensor " + t.name +
                        " is not part of this policy's adapter");
    if (it->second.sizes().vec() != t.shape)
      throw PolicyError("weights update " + std::to_string(version) + ": tensor " + t.name + " has the wrong shape");
    torch::ScalarType dt;
    try {
      dt = parse_dtype(t.dtype);
    } catch (const std::exception& e) {
      throw PolicyError("weights update " + std::to_string(version) + ": tensor " + t.name + ": " + e.what());
    }
    if (size_t(it->second.numel()) * c10::elementSize(dt) != t.data.size())
      throw PolicyError("weights update " + std::to_string(version) + ": tensor " + t.name +
                        " holds the wrong number of bytes");
    auto src = torch::from_blob(const_cast<uint8_t*>(t.data.data()), t.shape, torch::TensorOptions().dtype(dt));
    todo.emplace_back(it->second, src);
  }
  torch::NoGradGuard ng;
  for (auto& [dst, src] : todo) dst.copy_(src);
  impl_->version = version;
}

std::vector<TensorBlob> Policy::adapter_blobs() const { return lora_blobs(*impl_->model); }

void Policy::save_adapter(const std::string& dir) const {
  try {
    impl_->model->save_lora(dir, fs::absolute(impl_->opt.model_dir).string());
  } catch (const std::exception& e) {
    throw PolicyError(e.what());
  }
}

void Policy::export_merged(const std::string& dir) {
  auto& m = *impl_->model;
  m.merge_lora();
  fs::create_directories(dir);
  save_tensors((fs::path(dir) / "model.safetensors").string(), m.base_tensors(), std::nullopt, {{"format", "pt"}});
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                        "special_tokens_map.json"}) {
    fs::path src = fs::path(impl_->opt.model_dir) / f;
    if (fs::exists(src)) fs::copy_file(src, fs::path(dir) / f, fs::copy_options::overwrite_existing);
  }
}

}  // namespace kernelrl

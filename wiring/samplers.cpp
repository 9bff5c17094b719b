#include "wiring/samplers.hpp"

#include "core/log.hpp"
#include "core/mode.hpp"
#include "policy/sampler_backend.hpp"
#include "policy/tokenizer.hpp"
#include "tasks/prompt.hpp"

#include <cstdlib>
#include <filesystem>

namespace fs = std::filesystem;

namespace kernelrl {

namespace {

// One model backend: libtorch on `device`, or openai at `url`, writing its adapters under
// `adapter_sub` of the adapter folder.
std::shared_ptr<SamplerBackend> make_backend(const Config& cfg, const std::string& run_dir, const std::string& device,
                                             const std::string& url, const std::string& adapter_sub) {
  if (cfg.sampler.backend == "libtorch") {
    PolicyOptions po;
    po.model_dir = cfg.policy.model;
    po.adapter_dir = cfg.policy.adapter;
    po.device = device;
    po.dtype = cfg.policy.dtype;
    if (traits(cfg.experiment.mode).learns && po.adapter_dir.empty()) {  // somewhere for the learner's weights to go
      po.lora_rank = cfg.learner.lora_rank;
      po.lora_alpha = cfg.learner.lora_alpha;
      po.lora_targets = cfg.learner.lora_targets;
      po.seed = cfg.experiment.seed;
    }
    return make_libtorch_backend(po);
  }
  if (cfg.sampler.backend == "openai") {
    OpenAIOptions oo;
    oo.url = url;
    oo.model = cfg.sampler.served_model;
    oo.timeout_s = cfg.sampler.timeout_s;
    oo.max_retries = cfg.sampler.max_retries;
    if (const char* k = std::getenv(cfg.sampler.api_key_env.c_str())) oo.api_key = k;
    oo.adapter_root =
        cfg.sampler.adapter_dir.empty() ? (fs::path(run_dir) / "adapters").string() : cfg.sampler.adapter_dir;
    if (!adapter_sub.empty()) oo.adapter_root = (fs::path(oo.adapter_root) / adapter_sub).string();
    oo.lora_alpha = cfg.learner.lora_alpha;
    return make_openai_backend(oo);
  }
  return nullptr;
}

}  // namespace

std::string sampler_name(const NodeConfig& node, bool head, size_t i) {
  return head ? "sampler-" + std::to_string(i) : "sampler-" + node.name + "-" + std::to_string(i);
}

std::vector<std::shared_ptr<SamplerBackend>> make_backends(const Config& cfg, const std::string& run_dir,
                                                           const NodeConfig& node, bool head) {
  std::vector<std::shared_ptr<SamplerBackend>> out;
  if (cfg.sampler.backend == "libtorch") {
    const std::vector<std::string> devices = !node.sampler_devices.empty() ? node.sampler_devices
                                             : !cfg.sampler.devices.empty()
                                                 ? cfg.sampler.devices
                                                 : std::vector<std::string>{cfg.policy.device};
    for (auto& d : devices) out.push_back(make_backend(cfg, run_dir, d, "", ""));
  } else if (cfg.sampler.backend == "openai") {
    std::vector<std::string> urls = !node.sampler_urls.empty() ? node.sampler_urls : cfg.sampler.urls;
    if (urls.empty()) urls.push_back(cfg.sampler.url);
    // Each its own adapter folder where several write (every backend writes each version's files).
    const bool own = urls.size() > 1 || !head;
    for (size_t i = 0; i < urls.size(); ++i)
      out.push_back(make_backend(cfg, run_dir, "", urls[i], own ? sampler_name(node, head, i) : ""));
  } else {
    out.push_back(nullptr);
  }
  return out;
}

SamplerArgs sampler_settings(const Config& cfg) {
  SamplerArgs sma;
  sma.samples_per_task = cfg.sampler.samples_per_task;
  sma.params.temperature = cfg.sampler.temperature;
  sma.params.top_p = cfg.sampler.top_p;
  sma.params.max_tokens = cfg.sampler.max_tokens;
  sma.params.stop = cfg.sampler.stop;
  sma.params.seed = cfg.sampler.seed;
  sma.batch_prompts = cfg.sampler.batch_prompts;
  sma.evaluate_top_m = cfg.experiment.evaluate_top_m;
  sma.max_failures = cfg.sampler.max_failures;
  if (!cfg.sampler.bench_actions.empty()) {
    auto lg = log::get("sampler");
    std::vector<std::string> errors;
    size_t n = 0;
    for (auto& rec : load_replay(cfg.sampler.bench_actions, errors)) {
      sma.bench_actions[rec.task_id].push_back(std::move(rec.completion));
      ++n;
    }
    for (auto& e : errors) lg->error("[sampler] bench_actions: {}", e);
    lg->warn(
        "[sampler] bench_actions: {} recorded actions of {} tasks replace the model's completions of those "
        "tasks (a benchmark of the loop's pace: the rewards say nothing about the policy)",
        n, sma.bench_actions.size());
  }
  if (cfg.experiment.turns > 1) {
    // Later turns' prompts are measured in [policy] model's tokens where its tokenizer is at hand
    // (the libtorch backend always; openai when the model folder is given), else as a quarter of
    // their bytes.
    std::shared_ptr<Tokenizer> tok;
    if (!cfg.policy.model.empty() && fs::exists(fs::path(cfg.policy.model) / "tokenizer.json")) {
      try {
        tok = Tokenizer::load(cfg.policy.model);
      } catch (const std::exception&) {  // render_task_prompts reports a bad tokenizer first
      }
    }
    std::function<size_t(const std::string&)> count = [tok](const std::string& text) -> size_t {
      return tok ? tok->encode(text).size() : (text.size() + 3) / 4;
    };
    sma.render_turn = [policy = cfg.policy, budget = size_t(cfg.experiment.turn_prompt_tokens), count](
                          const std::string& user, const std::vector<Attempt>& history) {
      auto t = render_turn_prompt(policy, user, history, budget, count);
      return SamplerArgs::TurnRender{std::move(t.text), uint32_t(t.tokens)};
    };
  }
  return sma;
}

}  // namespace kernelrl

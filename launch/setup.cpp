#include "launch/setup.hpp"

#include <algorithm>

#include "core/files.hpp"
#include "core/log.hpp"
#include "core/paths.hpp"
#include "wiring/child.hpp"
#include "wiring/cluster.hpp"
#include "launch/json.hpp"
#include "policy/runtime_info.hpp"
#include "policy/tokenizer.hpp"
#include "store/store.hpp"
#include "tasks/prompt.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <set>

namespace fs = std::filesystem;

namespace kernelrl {

// Loads a config or prints every error (FILE:LINE:COLUMN: key: message) and returns nullopt.
namespace {
std::vector<std::string>& overrides() {
  static std::vector<std::string> sets;
  return sets;
}
}  // namespace

void set_config_overrides(std::vector<std::string> sets) { overrides() = std::move(sets); }
const std::vector<std::string>& config_overrides() { return overrides(); }

std::optional<Config> load_or_report(const std::string& path) {
  auto res = load_config(path, config_overrides());
  if (auto* errs = std::get_if<std::vector<ConfigError>>(&res)) {
    for (auto& e : *errs) std::fprintf(stderr, "%s\n", e.format().c_str());
    std::fprintf(stderr, "launch: %zu error%s in %s\n", errs->size(), errs->size() == 1 ? "" : "s", path.c_str());
    return std::nullopt;
  }
  return std::get<Config>(std::move(res));
}

namespace {
// The CUDA devices this process sees, asked of LibTorch once (which initialises the driver here).
int local_gpu_count() {
  static const int count = [] {
    const auto info = torch_runtime_info();
    return info.cuda_available ? info.cuda_devices : 0;
  }();
  return count;
}

// gpus = "auto" and device = "auto", for this process: every GPU LibTorch sees (the cpu_slots
// CPU evaluators only when there is none), and cuda:0 or cpu. False after printing why not.
bool resolve_auto_devices(Config& cfg) {
  bool any = cfg.policy.device == "auto" || cfg.learner.device == "auto";
  for (auto& n : cfg.nodes) any = any || n.gpus_auto;
  if (!any) return true;
  const int gpus = local_gpu_count();
  for (auto& n : cfg.nodes) {
    if (!n.gpus_auto) continue;
    n.gpus.clear();
    for (int g = 0; g < gpus; ++g) n.gpus.push_back(g);
    if (gpus > 0) n.cpu_slots = 0;  // evaluations on one kind of device: their timings compare
    if (has_role(n, "evaluator") && n.gpus.empty() && n.cpu_slots == 0) {
      std::fprintf(stderr,
                   "launch: %s: node %s: gpus = \"auto\" found no GPU here and cpu_slots is 0: nothing would "
                   "evaluate (set cpu_slots for machines without a GPU)\n",
                   cfg.source_file.c_str(), n.name.c_str());
      return false;
    }
    log::get("launch")->info("node {}: gpus = \"auto\": {}", n.name,
                             gpus > 0 ? fmt::format("{} GPU evaluator(s)", gpus)
                                      : fmt::format("no GPU here, {} CPU evaluator(s)", n.cpu_slots));
  }
  for (std::string* d : {&cfg.policy.device, &cfg.learner.device})
    if (*d == "auto") *d = gpus > 0 ? "cuda:0" : "cpu";
  return true;
}

}  // namespace

bool check_listed_gpus(const Config& cfg, const NodeConfig& node) {
  if (!has_role(node, "evaluator") || node.gpus.empty()) return true;
  // Asking initialises the CUDA driver in this process before its evaluators start, as gpus =
  // "auto" always did: on the lent H200 (2026-11-26), GPU evaluators started by a launch process
  // that had not initialised it failed every candidate's device set-up ("Invalid device id");
  // docs/BENCHMARKS.md, "Roles across processes".
  const int local_gpus = local_gpu_count();
  for (auto g : node.gpus)
    if (g >= local_gpus) {
      std::fprintf(stderr,
                   "launch: %s: node %s: gpus lists device %lld, but this machine has %d GPU(s)%s (gpus = \"auto\" "
                   "uses every one there is)\n",
                   cfg.source_file.c_str(), node.name.c_str(), static_cast<long long>(g), local_gpus,
                   local_gpus > 0 ? fmt::format(" (0 to {})", local_gpus - 1).c_str() : "");
      return false;
    }
  return true;
}

// Loads CONFIG, sets the log level (the command line's, else [cluster] log_level) and resolves
// its "auto" devices for this process; with render_prompts, its "auto" chat template too (a process that
// renders no prompt, such as `launch serve`, skips that transformers call).
std::optional<Config> load_with_level(const std::string& config_path, const std::string& log_level,
                                      bool render_prompts) {
  auto loaded = load_or_report(config_path);
  if (!loaded) return std::nullopt;
  std::string level = log_level.empty() ? loaded->cluster.log_level : log_level;
  if (!log::set_level(level)) {
    std::fprintf(stderr, "launch: --log-level: expected trace, debug, info, warn, error or off, got \"%s\"\n",
                 level.c_str());
    return std::nullopt;
  }
  if (!resolve_auto_devices(*loaded)) return std::nullopt;
  if (render_prompts) resolve_chat_template(*loaded);
  return loaded;
}

nlohmann::json read_json_file(const std::string& path, std::string& err) {
  std::ifstream in(path);
  if (!in) {
    err = path + ": cannot read";
    return nullptr;
  }
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) err = path + ": not valid JSON";
  return j.is_discarded() ? nlohmann::json(nullptr) : j;
}

void resolve_chat_template(Config& cfg) {
  auto& p = cfg.policy;
  if (p.template_ != "auto") return;
  auto lg = log::get("launch");
  auto fallback = [&](const std::string& why) {
    p.template_ = "chatml";
    lg->info("prompts: [policy] template = \"auto\": {}; the built-in chatml template is used", why);
  };
  if (p.model.empty()) return fallback("no [policy] model to read a chat template from");
  std::string err;
  const auto config = fs::exists(fs::path(p.model) / "tokenizer_config.json")
                          ? read_json_file((fs::path(p.model) / "tokenizer_config.json").string(), err)
                          : nlohmann::json(nullptr);
  const bool has =
      fs::exists(fs::path(p.model) / "chat_template.jinja") || (config.is_object() && config.contains("chat_template"));
  if (!has) return fallback(p.model + " has no chat template (tokenizer_config.json chat_template)");
  // Rendered by transformers (tasks/chat_template.py): the template's pieces, once per process.
  const std::string out =
      (fs::temp_directory_path() / ("kernelrl-chat-" + std::to_string(::getpid()) + ".json")).string();
  const int rc = run_child({cfg.evaluator.python, source_dir() + "/tasks/chat_template.py", p.model}, out);
  nlohmann::json j = read_json_file(out, err);
  if (!j.is_object()) j = {{"error", fmt::format("tasks/chat_template.py exited with {}", rc)}};
  std::error_code ec;
  fs::remove(out, ec);
  if (j.contains("error")) return fallback(j["error"].get<std::string>());
  p.template_ = j["template"].get<std::string>();
  p.model_turns = PolicyConfig::TurnText{j["user_to_assistant"].get<std::string>(),
                                         j["assistant_to_user"].get<std::string>(), j["generation"].get<std::string>()};
  lg->info("prompts: {}'s own chat template (rendered by transformers)", p.model);
}

// The store of RUN_DIR (or a store file), read-only; null after printing why, with rc 2 when
// there is none and 1 when it cannot be read.
std::unique_ptr<Store> open_run_store(const char* cmd, const std::string& run_dir, int& rc) {
  fs::path p = run_dir;
  if (fs::is_directory(p)) p /= "store.sqlite";
  if (!fs::exists(p)) {
    // A comparison's (or a per-task run's) folder holds its runs one level or two down: name them.
    std::vector<std::string> runs;
    std::error_code ec;
    if (fs::is_directory(run_dir, ec))
      for (auto it = fs::recursive_directory_iterator(run_dir, ec); it != fs::recursive_directory_iterator();
           it.increment(ec)) {
        if (ec) break;
        if (it.depth() >= 1) it.disable_recursion_pending();
        if (it->is_directory(ec) && fs::exists(it->path() / "store.sqlite", ec)) runs.push_back(it->path().string());
      }
    std::sort(runs.begin(), runs.end());
    std::string hint;
    if (!runs.empty()) {
      hint = fmt::format("; it holds {} run{}: ", runs.size(), runs.size() == 1 ? "" : "s");
      for (size_t i = 0; i < runs.size() && i < 6; ++i) hint += (i ? ", " : "") + runs[i];
      if (runs.size() > 6) hint += ", ...";
      hint += fmt::format(" (e.g. launch {} {})", cmd, runs.front());
      if (fs::exists(fs::path(run_dir) / "comparison.json", ec))
        hint += fmt::format("; `launch report {}` shows the comparison", run_dir);
    }
    std::fprintf(stderr, "launch %s: %s: no run store here%s\n", cmd, p.string().c_str(), hint.c_str());
    rc = 2;
    return nullptr;
  }
  std::string err;
  auto store = Store::open_readonly(p.string(), err);
  if (!store) {
    std::fprintf(stderr, "launch %s: %s\n", cmd, err.c_str());
    rc = 1;
  }
  return store;
}

// Every sample of a store as the analysis reads it.
std::vector<AnalysisSample> analysis_samples(Store& store) {
  std::vector<AnalysisSample> out;
  for (auto& r : store.samples()) {
    EvalStatus status = EvalStatus::runtime_error;
    const bool verdict = !from_string(r.status, status) || is_verdict(status);
    const bool unconfirmed = r.status == "unconfirmed";  // correct, not counted faster until confirmed
    out.push_back({verdict, r.task_id, r.step, r.status == "ok" || unconfirmed,
                   unconfirmed ? std::min(r.speedup, 1.0) : r.speedup, r.reward, r.logprob_mean, r.num_tokens,
                   r.record.rollout.split, r.status == "hacked", r.record.rollout.turn, r.sample_id,
                   r.record.rollout.parent_id, r.status == "format_error", unconfirmed});
  }
  return out;
}

}  // namespace kernelrl

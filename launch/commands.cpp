#include "launch/commands.hpp"
#include "launch/json.hpp"
#include "launch/cluster.hpp"

#include "actors/dispatcher.hpp"
#include "actors/evaluator.hpp"
#include "actors/checkpoint_selector.hpp"
#include "analysis/analysis.hpp"
#include "analysis/report.hpp"
#include "actors/gate.hpp"
#include "actors/learner.hpp"
#include "actors/monitor.hpp"
#include "actors/reward.hpp"
#include "actors/sampler.hpp"
#include "policy/sampler_backend.hpp"
#include "tasks/prompt.hpp"
#include "actors/supervisor.hpp"
#include "core/auth.hpp"
#include "core/config.hpp"
#include "core/log.hpp"
#include "core/paths.hpp"
#include "learner/lora_learner.hpp"
#include "policy/runtime_info.hpp"
#include "messages/messages.hpp"
#include "store/store.hpp"
#include "tasks/task_set.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

namespace fs = std::filesystem;

namespace kernelrl {

namespace {

// Loads a config or prints every error (FILE:LINE:COLUMN: key: message) and returns nullopt.
std::optional<Config> load_or_report(const std::string& path) {
  auto res = load_config(path);
  if (auto* errs = std::get_if<std::vector<ConfigError>>(&res)) {
    for (auto& e : *errs) std::fprintf(stderr, "%s\n", e.format().c_str());
    std::fprintf(stderr, "launch: %zu error%s in %s\n", errs->size(), errs->size() == 1 ? "" : "s", path.c_str());
    return std::nullopt;
  }
  return std::get<Config>(std::move(res));
}

void print_summary(const nlohmann::json& j, const std::string& run_dir) {
  if (j.contains("steps") && !j["steps"].empty()) {  // train: one line per step
    std::printf("\n%5s %8s %7s %11s %8s %10s %9s %8s\n", "step", "samples", "fast_1", "mean reward", "version", "loss",
                "grad norm", "entropy");
    for (auto& st : j["steps"]) {
      auto l = st.value("learner", nlohmann::json::object());
      auto num = [&](const char* k, const char* f) {
        return l.contains(k) ? fmt::format(fmt::runtime(f), l[k].get<double>()) : std::string("-");
      };
      std::printf("%5u %8llu %7.3f %11.3f %8llu %10s %9s %8s\n", st["step"].get<uint32_t>(),
                  static_cast<unsigned long long>(st["samples"].get<uint64_t>()), st["fast_1"].get<double>(),
                  st["mean_reward"].get<double>(),
                  static_cast<unsigned long long>(st["policy_version"].get<uint64_t>()), num("loss", "{:.4f}").c_str(),
                  num("grad_norm", "{:.3f}").c_str(), num("entropy", "{:.3f}").c_str());
    }
    std::printf("policy version %llu; checkpoints in %s/checkpoints\n",
                static_cast<unsigned long long>(j.value("policy_version", uint64_t{0})), run_dir.c_str());
    if (j.contains("boa"))
      std::printf("best of adaptation: step %u (fast_1 %.3f), %s%s\n", j["boa"]["step"].get<uint32_t>(),
                  j["boa"]["fast_1"].get<double>(), j["boa"]["checkpoint"].get<std::string>().c_str(),
                  j.value("stopped_early", false) ? "; stopped early ([experiment] patience)" : "");
    if (j.contains("eval") && !j["eval"].empty()) {  // the held-out tasks, per evaluated version
      std::printf("\nheld-out evaluation (%zu tasks):\n%8s %8s %8s %7s %13s\n", j["eval_tasks"].size(), "version",
                  "samples", "correct", "fast_1", "mean speedup");
      for (auto& e : j["eval"])
        std::printf("%8llu %8llu %8.3f %7.3f %12.2fx\n",
                    static_cast<unsigned long long>(e["policy_version"].get<uint64_t>()),
                    static_cast<unsigned long long>(e["samples"].get<uint64_t>()), e["correct_rate"].get<double>(),
                    e["fast_1"].get<double>(), e["mean_speedup"].get<double>());
      if (j.contains("eval_best"))
        std::printf("best held-out: policy version %llu (fast_1 %.3f)%s\n",
                    static_cast<unsigned long long>(j["eval_best"]["policy_version"].get<uint64_t>()),
                    j["eval_best"]["fast_1"].get<double>(),
                    j["eval_best"].contains("checkpoint")
                        ? (", " + j["eval_best"]["checkpoint"].get<std::string>()).c_str()
                        : " (its checkpoint was not kept: raise [learner] keep_last)");
    }
  }
  std::printf("\n%-32s %8s %9s %7s %13s\n", "task", "samples", "correct", "fast_1", "mean speedup");
  for (auto& t : j["tasks"]) {
    std::string correct = fmt::format("{}/{}", t["correct"].get<uint64_t>(), t["samples"].get<uint64_t>());
    std::string sp = t["correct"].get<uint64_t>() ? fmt::format("{:.2f}x", t["mean_speedup"].get<double>()) : "-";
    std::printf("%-32s %8llu %9s %7.2f %13s\n", t["task_id"].get<std::string>().c_str(),
                static_cast<unsigned long long>(t["samples"].get<uint64_t>()), correct.c_str(),
                t["fast_1"].get<double>(), sp.c_str());
  }
  std::string correct = fmt::format("{}/{}", j["correct"].get<uint64_t>(), j["samples"].get<uint64_t>());
  std::string sp = j["correct"].get<uint64_t>() ? fmt::format("{:.2f}x", j["mean_speedup"].get<double>()) : "-";
  std::printf("%-32s %8llu %9s %7.2f %13s\n", "overall", static_cast<unsigned long long>(j["samples"].get<uint64_t>()),
              correct.c_str(), j["fast_1"].get<double>(), sp.c_str());
  std::string statuses;
  for (auto& [k, v] : j["status_counts"].items())
    statuses += (statuses.empty() ? "" : ", ") + k + " " + std::to_string(v.get<uint64_t>());
  std::printf("statuses: %s\n", statuses.empty() ? "(none)" : statuses.c_str());
  std::printf("wall time: %.1f s\n", j["wall_s"].get<double>());
  std::printf("run directory: %s\n", run_dir.c_str());
  std::fflush(stdout);
}

}  // namespace

int cmd_check(const std::string& config_path) {
  if (is_comparison_config(config_path)) return cmd_check_comparison(config_path);
  auto cfg = load_or_report(config_path);
  if (!cfg) return 2;
  std::printf("# %s: valid\n%s\n", cfg->source_file.c_str(), cfg->resolved_toml.c_str());
  return 0;
}

namespace {
// The config's tasks, and the eval tasks of its periodic evaluation (none without one).
bool load_experiment_tasks(const Config& cfg, TaskSet& tasks, TaskSet& eval_tasks, std::string& err) {
  if (!tasks.load(cfg.tasks, err)) return false;
  if (cfg.experiment.evaluates() && !eval_tasks.load(cfg.experiment.eval_tasks, err)) {
    err = "[experiment] eval: " + err;
    return false;
  }
  return true;
}

struct RenderedPrompt {
  std::string task_id, split;  // split: "" for [tasks], "eval" for an eval task
  std::string user, prompt;    // the user message, and the prompt the sampler sends
};

// Each task's prompt as the sampler renders it: the tasks, then the eval tasks not among them.
bool render_task_prompts(const Config& cfg, const TaskSet& tasks, const TaskSet& eval_tasks,
                         std::vector<RenderedPrompt>& out, std::string& err) {
  std::set<std::string> seen;
  for (auto* set : {&tasks, &eval_tasks})
    for (auto& t : set->tasks()) {
      if (!seen.insert(t.id).second) continue;  // an eval task that is also a training task
      RenderedPrompt p{t.id, set == &tasks ? "" : "eval", "", ""};
      if (!task_user_message(t, cfg.evaluator.action_space, p.user, err)) return false;
      p.prompt = render_prompt(cfg.policy, p.user);
      out.push_back(std::move(p));
    }
  return true;
}
}  // namespace

int cmd_prompts(const std::string& config_path) {
  auto cfg = load_or_report(config_path);
  if (!cfg) return 2;
  TaskSet tasks, eval_tasks;
  std::vector<RenderedPrompt> prompts;
  std::string err;
  if (!load_experiment_tasks(*cfg, tasks, eval_tasks, err) ||
      !render_task_prompts(*cfg, tasks, eval_tasks, prompts, err)) {
    std::fprintf(stderr, "launch prompts: %s\n", err.c_str());
    return 2;
  }
  for (auto& p : prompts)
    std::printf("%s\n",
                nlohmann::json{{"task_id", p.task_id}, {"split", p.split}, {"prompt", p.prompt}}.dump().c_str());
  return 0;
}

int cmd_version() {
  auto info = torch_runtime_info();
  std::printf("kernelrl %s (protocol %u)\n", KERNELRL_VERSION, protocol_version);
  std::printf("LibTorch %s, CUDA %s (%d device%s)\n", info.version.c_str(),
              info.cuda_available ? "available" : "not available", info.cuda_devices,
              info.cuda_devices == 1 ? "" : "s");
  return 0;
}

namespace {
// The store of RUN_DIR (or a store file), read-only; null after printing why, with rc 2 when
// there is none and 1 when it cannot be read.
std::unique_ptr<Store> open_run_store(const char* cmd, const std::string& run_dir, int& rc) {
  fs::path p = run_dir;
  if (fs::is_directory(p)) p /= "store.sqlite";
  if (!fs::exists(p)) {
    std::fprintf(stderr, "launch %s: %s: no run store here\n", cmd, p.string().c_str());
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
    out.push_back({verdict, r.task_id, r.step, r.status == "ok", r.speedup, r.reward, r.logprob_mean, r.num_tokens,
                   r.record.rollout.split});
  }
  return out;
}
}  // namespace

namespace {
// analyze() over the run's store, with the learner's per-step figures.
nlohmann::json run_analysis(Store& store, const AnalyzeOptions& o, const std::vector<AnalysisSample>& samples) {
  std::map<uint32_t, std::map<std::string, double>> learner;
  for (auto& run : store.runs())
    for (auto& row : store.steps(run))
      if (!row.learner.empty()) learner[row.stats.step] = row.learner;
  AnalysisOptions ao;
  ao.p = o.p;
  ao.ks = o.ks;
  ao.bootstrap = o.bootstrap;
  ao.seed = o.seed;
  ao.m = o.m;
  return analyze(samples, ao, learner);
}

// Writes a report page and prints its path; 1 when it cannot be written.
int write_report(const std::string& out, const std::string& html) {
  std::ofstream f(out);
  f << html;
  f.close();
  if (!f) {
    std::fprintf(stderr, "launch report: cannot write %s\n", out.c_str());
    return 1;
  }
  std::printf("%s\n", fs::absolute(out).lexically_normal().string().c_str());
  return 0;
}
}  // namespace

int cmd_report(const AnalyzeOptions& o) {
  int rc = 0;
  // A comparison config's folder: its comparison.json, and the arms side by side.
  if (fs::is_directory(o.run_dir) && !fs::exists(fs::path(o.run_dir) / "store.sqlite") &&
      fs::exists(fs::path(o.run_dir) / "comparison.json")) {
    std::ifstream in(fs::path(o.run_dir) / "comparison.json");
    auto c = nlohmann::json::parse(in, nullptr, false);
    if (c.is_discarded() || !c.is_object()) {
      std::fprintf(stderr, "launch report: %s/comparison.json: not valid JSON\n", o.run_dir.c_str());
      return 2;
    }
    return write_report(o.out.empty() ? (fs::path(o.run_dir) / "report.html").string() : o.out,
                        render_comparison_report(fs::absolute(o.run_dir).lexically_normal().string(), c));
  }
  auto store = open_run_store("report", o.run_dir, rc);
  if (!store) return rc;
  ReportInputs in;
  in.samples = analysis_samples(*store);
  in.analysis = run_analysis(*store, o, in.samples);
  fs::path dir = fs::is_directory(o.run_dir) ? fs::path(o.run_dir) : fs::path(o.run_dir).parent_path();
  in.title = fs::absolute(dir).lexically_normal().string();
  auto runs = store->runs();
  if (!runs.empty()) {
    auto s = store->summary(runs.back());
    if (!s.empty()) in.summary = nlohmann::json::parse(s, nullptr, false);
  }
  std::ifstream cj(dir / "compute.json");
  if (cj) in.compute = nlohmann::json::parse(cj, nullptr, false);
  if (in.compute.is_discarded()) in.compute = nullptr;
  if (in.summary.is_discarded()) in.summary = nullptr;
  return write_report(o.out.empty() ? (dir / "report.html").string() : o.out, render_report(in));
}

int cmd_analyze(const AnalyzeOptions& o) {
  int rc = 0;
  auto store = open_run_store("analyze", o.run_dir, rc);
  if (!store) return rc;
  auto samples = analysis_samples(*store);
  bool learner = false;
  for (auto& run : store->runs())
    for (auto& row : store->steps(run)) learner = learner || !row.learner.empty();
  auto j = run_analysis(*store, o, samples);
  j["run_dir"] = fs::absolute(o.run_dir).lexically_normal().string();
  if (o.json) {
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  auto f = [](const nlohmann::json& v, const char* spec) {
    return v.is_number() ? fmt::format(fmt::runtime(spec), v.get<double>()) : std::string("-");
  };
  std::string fast_cols;
  for (double t : o.p) fast_cols += fmt::format(" {:>8}", fmt::format("fast_{:g}", t));
  auto fast_vals = [&](const nlohmann::json& x) {
    std::string s;
    for (double t : o.p) s += fmt::format(" {:>8}", f(x[fmt::format("fast_{:g}", t)], "{:.3f}"));
    return s;
  };
  std::string fast_line;
  for (double t : o.p) fast_line += fmt::format(", fast_{:g} {}", t, f(j[fmt::format("fast_{:g}", t)], "{:.3f}"));
  std::printf("%s: %llu samples over %llu tasks; correct %.3f%s; mean speedup %s, geomean %s (correct samples)\n",
              j["run_dir"].get<std::string>().c_str(), (unsigned long long)j["samples"].get<uint64_t>(),
              (unsigned long long)j["tasks"].get<uint64_t>(), j["correct_rate"].get<double>(), fast_line.c_str(),
              f(j["mean_speedup"], "{:.2f}x").c_str(), f(j["geomean_speedup"], "{:.2f}x").c_str());
  if (j["steps"].size() > 1 || learner) {
    std::printf("\n%5s %8s %8s%s %11s %10s\n", "step", "samples", "correct", fast_cols.c_str(), "mean reward", "loss");
    for (auto& st : j["steps"]) {
      std::string loss =
          st.contains("learner") && st["learner"].contains("loss") ? f(st["learner"]["loss"], "{:.4f}") : "-";
      std::printf("%5u %8llu %8.3f%s %11.3f %10s\n", st["step"].get<uint32_t>(),
                  (unsigned long long)st["samples"].get<uint64_t>(), st["correct_rate"].get<double>(),
                  fast_vals(st).c_str(), st["mean_reward"].get<double>(), loss.c_str());
    }
  }
  if (j.contains("eval")) {  // a train run's periodic evaluation on held-out tasks
    auto& ev = j["eval"];
    std::printf("\nheld-out evaluation: %llu samples over %llu tasks\n%8s %8s %8s%s %9s\n",
                (unsigned long long)ev["samples"].get<uint64_t>(), (unsigned long long)ev["tasks"].get<uint64_t>(),
                "version", "samples", "correct", fast_cols.c_str(), "geomean");
    for (auto& st : ev["steps"])
      std::printf("%8u %8llu %8.3f%s %9s\n", st["step"].get<uint32_t>(),
                  (unsigned long long)st["samples"].get<uint64_t>(), st["correct_rate"].get<double>(),
                  fast_vals(st).c_str(), f(st["geomean_speedup"], "{:.2f}x").c_str());
  }
  std::printf("\n%-32s %8s %8s%s %9s %9s\n", "task", "samples", "correct", fast_cols.c_str(), "geomean", "best");
  for (auto& t : j["per_task"])
    std::printf("%-32s %8llu %8.3f%s %9s %9s\n", t["task_id"].get<std::string>().c_str(),
                (unsigned long long)t["samples"].get<uint64_t>(), t["correct_rate"].get<double>(), fast_vals(t).c_str(),
                f(t["geomean_speedup"], "{:.2f}x").c_str(), f(t["best_speedup"], "{:.2f}x").c_str());
  std::string fk = fmt::format(
      "fast_{:g}", o.p.empty() ? 1.0 : (std::find(o.p.begin(), o.p.end(), 1.0) != o.p.end() ? 1.0 : o.p[0]));
  std::printf("\n%5s %6s %8s %19s %8s %19s\n", "k", "tasks", "pass@k", "95% CI", (fk + "@k").c_str(), "95% CI");
  for (auto& a : j["at_k"]) {
    auto ci = [&](const char* key) {
      return a.contains(key) ? fmt::format("[{}, {}]", f(a[key][0], "{:.3f}"), f(a[key][1], "{:.3f}"))
                             : std::string("-");
    };
    std::printf("%5u %6llu %8s %19s %8s %19s\n", a["k"].get<uint32_t>(), (unsigned long long)a["tasks"].get<uint64_t>(),
                f(a["pass"], "{:.3f}").c_str(), ci("pass_ci").c_str(), f(a[fk], "{:.3f}").c_str(),
                ci((fk + "_ci").c_str()).c_str());
  }
  auto& lj = j["logprob_vs_speedup"];
  std::printf("\nmean logprob vs speedup (%llu correct samples with tokens): Spearman rho %s, partial on length %s\n",
              (unsigned long long)lj["n"].get<uint64_t>(), f(lj["spearman_rho"], "{:.3f}").c_str(),
              f(lj["partial_spearman_rho_length"], "{:.3f}").c_str());
  for (auto& q : lj["surprisal_quartiles"])
    std::printf("  surprisal Q%d: %llu samples, mean logprob %.3f, mean speedup %.2fx, faster %.2f\n",
                q["quartile"].get<int>(), (unsigned long long)q["n"].get<uint64_t>(), q["mean_logprob"].get<double>(),
                q["mean_speedup"].get<double>(), q["faster_share"].get<double>());
  auto& sel = j["selection"];
  if (sel["groups"].get<uint64_t>() > 0) {
    std::printf("\nselection over %llu groups (a task's samples in one step), m = %u:\n%-18s %7s %8s %13s %12s\n",
                (unsigned long long)sel["groups"].get<uint64_t>(), o.m, "strategy", "fast_1", "correct", "mean speedup",
                "evaluations");
    for (const char* name :
         {"oracle", "random_correct", "confidence", "surprisal", "surprisal_top_m", "deployable_top_m"}) {
      if (!sel["strategies"].contains(name)) continue;
      auto& x = sel["strategies"][name];
      std::printf("%-18s %7.3f %8.3f %12.2fx %12.1f\n", name, x["fast_1"].get<double>(), x["correct"].get<double>(),
                  x["mean_speedup"].get<double>(), x["evaluations_per_group"].get<double>());
    }
  }
  return 0;
}

int cmd_compare(const CompareOptions& o) {
  // Settings that must be equal for a fair comparison, and the compute figure that must match.
  static const std::vector<std::string> same = {"temperature", "top_p",      "max_tokens", "eval_mode",
                                                "model",       "checkpoint", "tasks"};
  struct Run {
    std::string dir;
    nlohmann::json compute, analysis;
    double score = 0;  // fast_1, or the Best-of-Adaptation step's fast_1
  };
  std::vector<Run> runs;
  for (auto& d : o.run_dirs) {
    Run r;
    r.dir = d;
    std::ifstream in(fs::path(d) / "compute.json");
    if (!in) {
      std::fprintf(stderr, "launch compare: %s: no compute.json (a run that did not finish?)\n", d.c_str());
      return 2;
    }
    try {
      in >> r.compute;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "launch compare: %s/compute.json: %s\n", d.c_str(), e.what());
      return 2;
    }
    int rc = 0;
    auto store = open_run_store("compare", d, rc);
    if (!store) return rc;
    auto samples = analysis_samples(*store);
    AnalysisOptions ao;
    ao.bootstrap = 0;
    uint64_t min_n = 0;  // the full scaling curve: every k up to the smallest task's sample count
    {
      std::map<std::string, uint64_t> per_task;
      for (auto& x : samples)
        if (x.evaluated) ++per_task[x.task_id];
      for (auto& [t, n] : per_task) min_n = min_n ? std::min(min_n, n) : n;
      for (uint64_t k = 1; k <= min_n; ++k) ao.ks.push_back(uint32_t(k));
    }
    r.analysis = analyze(samples, ao);
    // A run's score against another's curve: its Best-of-Adaptation fast_1 when it adapted, else its fast_1.
    r.score = r.analysis["fast_1"].get<double>();
    for (auto& id : store->runs()) {
      auto text = store->summary(id);
      if (text.empty()) continue;
      auto sj = nlohmann::json::parse(text, nullptr, false);
      if (sj.is_object() && sj.contains("boa")) r.score = sj["boa"].value("fast_1", r.score);
    }
    runs.push_back(std::move(r));
  }
  std::vector<std::string> differences;
  const auto& first = runs.front();
  for (size_t i = 1; i < runs.size(); ++i) {
    const auto& r = runs[i];
    auto setting = [](const Run& x, const std::string& k) {
      const auto& st = x.compute.value("settings", nlohmann::json::object());
      return st.contains(k) ? st[k].get<std::string>() : std::string("(unset)");
    };
    // The strategies (modes, K per step) may differ; the settings and the rollouts spent may not.
    for (auto& k : same)
      if (setting(first, k) != setting(r, k))
        differences.push_back(
            fmt::format("{}: {} in {} but {} in {}", k, setting(first, k), first.dir, setting(r, k), r.dir));
    auto rollouts = [](const Run& x) { return x.compute.value("rollouts", uint64_t{0}); };
    if (rollouts(first) != rollouts(r))
      differences.push_back(
          fmt::format("rollouts: {} in {} but {} in {}", rollouts(first), first.dir, rollouts(r), r.dir));
  }
  if (!differences.empty() && !o.allow_mismatch) {
    std::fprintf(
        stderr,
        "launch compare: the budgets differ, so the comparison is refused (--allow-mismatch compares anyway):\n");
    for (auto& d : differences) std::fprintf(stderr, "  %s\n", d.c_str());
    return 3;
  }
  for (auto& d : differences) std::fprintf(stderr, "launch compare: warning: %s\n", d.c_str());
  // Equivalent K: where each run's score falls on the first sampled run's fast_1@k curve (the
  // first run with at least two samples per task: a best-of-N or eval run of K samples).
  const Run* ref = nullptr;
  for (auto& r : runs)
    if (!ref && r.analysis["at_k"].size() >= 2) ref = &r;
  std::vector<std::pair<double, double>> curve;
  if (ref)
    for (auto& a : ref->analysis["at_k"])
      if (a["fast_1"].is_number()) curve.emplace_back(a["k"].get<double>(), a["fast_1"].get<double>());
  auto equiv = [&](const Run& r) -> nlohmann::json {
    if (curve.empty()) return nullptr;
    double k = equivalent_k(curve, r.score);
    return std::isfinite(k) ? nlohmann::json(k) : nlohmann::json(nullptr);
  };
  if (o.json) {
    nlohmann::json j = {{"differences", differences},
                        {"runs", nlohmann::json::array()},
                        {"curve_of", ref ? nlohmann::json(ref->dir) : nlohmann::json(nullptr)}};
    for (auto& r : runs)
      j["runs"].push_back({{"run_dir", r.dir},
                           {"compute", r.compute},
                           {"analysis", r.analysis},
                           {"score", r.score},
                           {"equivalent_k", equiv(r)}});
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("%-40s %-10s %9s %14s %9s %9s %8s %8s %8s %8s %8s %7s\n", "run", "mode", "rollouts", "student tok",
              "eval s", "learner s", "correct", "fast_1", "fast_1.2", "oracle", "score", "equiv K");
  for (auto& r : runs) {
    auto& a = r.analysis;
    auto& sel = a["selection"]["strategies"];
    std::string oracle = sel.contains("oracle") ? fmt::format("{:.3f}", sel["oracle"]["fast_1"].get<double>()) : "-";
    auto ek = equiv(r);
    std::string eks = ek.is_number() ? fmt::format("{:.1f}", ek.get<double>()) : (curve.empty() ? "-" : "> K");
    std::printf(
        "%-40s %-10s %9llu %14llu %9.1f %9.1f %8.3f %8.3f %8.3f %8s %8.3f %7s\n",
        fs::path(r.dir).filename().string().c_str(), r.compute["settings"].value("mode", std::string("?")).c_str(),
        (unsigned long long)r.compute.value("rollouts", uint64_t{0}),
        (unsigned long long)r.compute.value("student_tokens", uint64_t{0}), r.compute.value("eval_seconds", 0.0),
        r.compute.value("learner_seconds", 0.0), a["correct_rate"].get<double>(), a["fast_1"].get<double>(),
        a["fast_1.2"].get<double>(), oracle.c_str(), r.score, eks.c_str());
  }
  if (ref)
    std::printf(
        "score: fast_1 (a train/ttt run: its Best-of-Adaptation step's); equiv K: the k at which %s's fast_1@k "
        "reaches that score\n",
        fs::path(ref->dir).filename().string().c_str());
  return 0;
}

int cmd_export(const std::string& run_dir) {
  int rc = 0;
  auto store = open_run_store("export", run_dir, rc);
  if (!store) return rc;
  for (auto& r : store->samples()) {
    const auto& e = r.record.result;
    nlohmann::json j = result_json(e);
    j.update({
        {"run_id", r.run_id},
        {"sample_id", r.sample_id},
        {"task_id", r.task_id},
        {"step", r.step},
        {"group_id", r.group_id},
        {"sample_index", r.sample_index},
        {"status", r.status},
        {"error", r.error},
        {"speedup", r.speedup},
        {"reward", r.reward},
        {"policy_version", r.policy_version},
        {"num_tokens", r.num_tokens},
        {"logprob_mean", r.logprob_mean},
        {"completion", r.record.rollout.completion},
        {"prompt", r.record.rollout.prompt},
        {"token_ids", r.record.rollout.token_ids},
        {"logprobs", r.record.rollout.logprobs},
        {"sampler_id", r.record.rollout.sampler_id},
        {"split", r.record.rollout.split},
        {"assembled_code", e.assembled_code},
        {"compile_log", e.compile_log},
    });
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}

// gpus = "auto" and device = "auto", for this process: every GPU LibTorch sees (the cpu_slots
// CPU evaluators only when there is none), and cuda:0 or cpu. False after printing why not.
bool resolve_auto_devices(Config& cfg) {
  bool any = cfg.policy.device == "auto" || cfg.learner.device == "auto";
  for (auto& n : cfg.nodes) any = any || n.gpus_auto;
  if (!any) return true;
  const auto info = torch_runtime_info();
  const int gpus = info.cuda_available ? info.cuda_devices : 0;
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

// Loads CONFIG, sets the log level (the command line's, else [cluster] log_level) and resolves
// its "auto" devices for this process.
std::optional<Config> load_with_level(const std::string& config_path, const std::string& log_level) {
  auto loaded = load_or_report(config_path);
  if (!loaded) return std::nullopt;
  std::string level = log_level.empty() ? loaded->cluster.log_level : log_level;
  if (!log::set_level(level)) {
    std::fprintf(stderr, "launch: --log-level: expected trace, debug, info, warn, error or off, got \"%s\"\n",
                 level.c_str());
    return std::nullopt;
  }
  if (!resolve_auto_devices(*loaded)) return std::nullopt;
  return loaded;
}

int cmd_node(const std::string& config_path, const std::string& node, const std::string& log_level) {
  auto cfg = load_with_level(config_path, log_level);
  if (!cfg) return 2;
  return run_node(*cfg, node);
}

int cmd_join(const std::string& config_path, const JoinOptions& o, const std::string& log_level) {
  auto cfg = load_with_level(config_path, log_level);
  if (!cfg) return 2;
  if (!is_cluster(*cfg)) {
    std::fprintf(stderr, "launch: --join: %s describes no cluster (no [[node]] has a port)\n",
                 cfg->source_file.c_str());
    return 2;
  }
  return run_join(*cfg, o);
}

namespace {
// The newest complete checkpoint of RUN_DIR, or "".
std::string latest_checkpoint(const std::string& run_dir) {
  auto all = list_checkpoints((fs::path(run_dir) / "checkpoints").string());
  return all.empty() ? std::string() : all.back().second;
}
}  // namespace

int cmd_run(const std::string& config_path, const std::string& run_dir_arg, const std::string& log_level, bool resume) {
  auto loaded = load_with_level(config_path, log_level);
  if (!loaded) return 2;
  Config cfg = std::move(*loaded);
  auto lg = log::get("launch");
  const bool cluster = is_cluster(cfg);
  std::optional<std::string> secret;
  if (cluster) {
    std::string err;
    secret = read_cluster_secret(cfg.cluster, err);
    if (!secret) {
      lg->error("{}", err);
      return 2;
    }
  }

  TaskSet tasks, eval_tasks;  // eval_tasks: train's held-out tasks of the periodic evaluation
  std::string err;
  if (!load_experiment_tasks(cfg, tasks, eval_tasks, err)) {
    lg->error("{}", err);
    return 2;
  }
  if (eval_tasks.size() > 0) {
    size_t shared = 0;
    for (auto& t : eval_tasks.tasks()) shared += tasks.find(t.id) ? 1 : 0;
    if (shared > 0)
      lg->warn("[experiment] eval: {} of the {} eval tasks are also training tasks: their figures are not held out",
               shared, eval_tasks.size());
  }
  std::vector<ReplayRecord> records;
  std::vector<SamplerArgs::TaskPrompt> prompts;
  std::map<std::string, std::string> user_messages;  // by task: what the student was asked (SDPO's teacher sees more)
  if (cfg.sampler.backend == "replay") {
    std::vector<std::string> replay_errors;
    records = load_replay(cfg.sampler.replay, replay_errors);
    for (auto& e : replay_errors) lg->error("{}", e);
    if (!cfg.tasks.ids.empty() || !cfg.tasks.split.empty()) {  // a selection also selects what is replayed
      size_t before = records.size();
      std::erase_if(records, [&](const ReplayRecord& r) { return !tasks.find(r.task_id); });
      if (before != records.size())
        lg->info("tasks: {} replayed actions for tasks not selected are left out", before - records.size());
    }
    if (records.empty()) {
      lg->error("{}: no replay actions to evaluate", cfg.sampler.replay);
      return 2;
    }
  } else {
    std::vector<RenderedPrompt> rendered;
    if (!render_task_prompts(cfg, tasks, eval_tasks, rendered, err)) {
      lg->error("{}", err);
      return 2;
    }
    for (auto& p : rendered) {
      prompts.push_back({p.task_id, p.prompt});
      user_messages[p.task_id] = p.user;
    }
  }

  const ModeTraits& mode = traits(cfg.experiment.mode);
  const bool adapts = mode.adapts;  // every task, every step
  const bool train = mode.learns;   // a learner updates the policy
  if (resume) {
    if (!train) {
      lg->error("--resume {}: only train, ttt and sdpo runs resume ({} has [experiment] mode = \"{}\")", run_dir_arg,
                config_path, mode.name);
      return 2;
    }
    if (!fs::exists(fs::path(run_dir_arg) / cfg.store.file) || latest_checkpoint(run_dir_arg).empty()) {
      lg->error("--resume {}: not a train run directory (no {} or no checkpoints/step-N)", run_dir_arg, cfg.store.file);
      return 2;
    }
  }
  std::string run_dir;
  if (run_dir_arg.empty()) {
    run_dir = make_run_dir(cfg.experiment.run_root, cfg.experiment.name);
  } else {
    std::error_code ec;
    fs::create_directories(run_dir_arg, ec);
    if (ec || !fs::is_directory(run_dir_arg)) {
      lg->error("--run-dir {}: cannot create directory: {}", run_dir_arg, ec.message());
      return 2;
    }
    run_dir = fs::absolute(run_dir_arg).lexically_normal().string();
  }
  fs::create_directories(fs::path(run_dir) / "workers");
  if (!resume) std::ofstream(fs::path(run_dir) / "config.resolved.toml") << cfg.resolved_toml;
  log::add_run_file((fs::path(run_dir) / "launch.log").string());
  std::string run_id = fs::path(run_dir).filename().string();
  if (cfg.sampler.backend == "replay")
    lg->info("run {} ({} mode, {} tasks, {} actions) in {}", run_id, mode.name, tasks.size(), records.size(), run_dir);
  else if (train)
    lg->info("run {} ({}: {} steps of {} tasks x {} samples from the {} sampler, {} tasks in all) in {}", run_id,
             mode.name, cfg.learner.steps, adapts ? tasks.size() : cfg.learner.batch_size, cfg.learner.group_size,
             cfg.sampler.backend, tasks.size(), run_dir);
  else
    lg->info("run {} ({} mode, {} tasks, {} samples each from the {} sampler) in {}", run_id, mode.name, tasks.size(),
             std::max<uint32_t>(1, cfg.sampler.samples_per_task), cfg.sampler.backend, run_dir);
  // The model backend is made before the actor system: a model that does not load is a clear
  // error here, not a dead actor later.
  std::shared_ptr<SamplerBackend> backend;
  try {
    if (cfg.sampler.backend == "libtorch") {
      PolicyOptions po;
      po.model_dir = cfg.policy.model;
      po.adapter_dir = cfg.policy.adapter;
      po.device = cfg.policy.device;
      po.dtype = cfg.policy.dtype;
      if (train && po.adapter_dir.empty()) {  // somewhere for the learner's weights to go
        po.lora_rank = cfg.learner.lora_rank;
        po.lora_alpha = cfg.learner.lora_alpha;
        po.lora_targets = cfg.learner.lora_targets;
        po.seed = cfg.experiment.seed;
      }
      backend = make_libtorch_backend(po);
    } else if (cfg.sampler.backend == "openai") {
      OpenAIOptions oo;
      oo.url = cfg.sampler.url;
      oo.model = cfg.sampler.served_model;
      oo.timeout_s = cfg.sampler.timeout_s;
      oo.max_retries = cfg.sampler.max_retries;
      if (const char* k = std::getenv(cfg.sampler.api_key_env.c_str())) oo.api_key = k;
      oo.adapter_root =
          cfg.sampler.adapter_dir.empty() ? (fs::path(run_dir) / "adapters").string() : cfg.sampler.adapter_dir;
      oo.lora_alpha = cfg.learner.lora_alpha;
      backend = make_openai_backend(oo);
    }
  } catch (const std::exception& e) {
    lg->error("{}", e.what());
    return 2;
  }
  // train: the learner's model and adapter (a resumed run: its latest checkpoint's, optimizer included).
  std::shared_ptr<LoraLearner> engine;
  if (train) {
    LearnerOptions lo;
    lo.model_dir = cfg.policy.model;
    lo.adapter_dir = cfg.policy.adapter;
    lo.device = cfg.learner.device;
    lo.dtype = cfg.learner.dtype;
    lo.lora_rank = cfg.learner.lora_rank;
    lo.lora_alpha = cfg.learner.lora_alpha;
    lo.lora_dropout = cfg.learner.lora_dropout;
    lo.lora_targets = cfg.learner.lora_targets;
    lo.seed = cfg.experiment.seed;
    lo.estimator = cfg.learner.algorithm;
    lo.adv_eps = cfg.learner.adv_eps;
    lo.learning_rate = cfg.learner.learning_rate;
    lo.weight_decay = cfg.learner.weight_decay;
    lo.max_grad_norm = cfg.learner.max_grad_norm;
    lo.schedule = cfg.learner.lr_schedule;
    lo.warmup_steps = cfg.learner.warmup_steps;
    lo.total_steps = cfg.learner.steps;
    lo.temperature = cfg.sampler.temperature;
    lo.clip_low = cfg.learner.clip_low;
    lo.clip_high = cfg.learner.clip_high;
    lo.kl_coef = cfg.learner.kl_coef;
    lo.entropy_coef = cfg.learner.entropy_coef;
    lo.objective = mode.objective;
    lo.sdpo_beta = cfg.sdpo.beta;
    lo.aggregation = cfg.learner.aggregation;
    lo.minibatch_size = cfg.learner.minibatch_size;
    try {
      engine = LoraLearner::create(lo);
      if (resume) {
        std::string ck = latest_checkpoint(run_dir);
        engine->load_checkpoint(ck);
        lg->info("resuming from {} (policy version {})", ck, engine->version());
      }
    } catch (const std::exception& e) {
      lg->error("{}", e.what());
      return 2;
    }
  }
  if (cfg.nodes.size() > 1 && !cluster)
    lg->warn("no [[node]] has a port: the roles of all {} [[node]] entries run in this process", cfg.nodes.size());

  caf::actor_system_config sys_cfg;
  add_message_types(sys_cfg);
  if (cluster) configure_middleman(sys_cfg, cfg.cluster);
  sys_cfg.set("logger.verbosity", caf::atom("quiet"));
  caf::actor_system sys{sys_cfg};
  int rc = 1;
  {
    SupervisorArgs sa;
    ExperimentArgs& ex = sa.experiment;
    ex.run_id = run_id;
    ex.run_dir = run_dir;
    ex.mode = cfg.experiment.mode;
    for (auto& t : tasks.tasks()) ex.task_ids.push_back(t.id);
    ex.settings = {{"mode", mode.name},
                   {"sampler", cfg.sampler.backend},
                   {"samples_per_task", std::to_string(train ? cfg.learner.group_size
                                                             : std::max<uint32_t>(1, cfg.sampler.samples_per_task))},
                   {"temperature", fmt::format("{:g}", cfg.sampler.temperature)},
                   {"top_p", fmt::format("{:g}", cfg.sampler.top_p)},
                   {"max_tokens", std::to_string(cfg.sampler.max_tokens)},
                   {"eval_mode", cfg.evaluator.mode},
                   {"model", cfg.sampler.backend == "openai" ? cfg.sampler.served_model : cfg.policy.model},
                   {"checkpoint", cfg.policy.adapter},
                   {"replay", cfg.sampler.replay},
                   {"tasks", std::to_string(tasks.size())}};
    if (cfg.experiment.mode == Mode::sdpo) ex.settings["sdpo_context"] = cfg.sdpo.context;
    if (cfg.experiment.evaluate_top_m > 0)
      ex.settings["evaluate_top_m"] = std::to_string(cfg.experiment.evaluate_top_m);
    if (eval_tasks.size() > 0) {
      ex.settings["eval_tasks"] = std::to_string(eval_tasks.size());
      ex.settings["eval_every"] = std::to_string(cfg.experiment.eval_every);
    }
    sa.store_path = (fs::path(run_dir) / cfg.store.file).string();
    sa.synchronous = cfg.store.synchronous;
    sa.config_toml = cfg.resolved_toml;

    DispatcherArgs da;
    for (auto& t : tasks.tasks()) da.task_paths[t.id] = t.path;
    for (auto& t : eval_tasks.tasks()) da.task_paths[t.id] = t.path;
    da.action_space = cfg.evaluator.action_space;
    da.mode = cfg.evaluator.mode;
    da.seed = cfg.evaluator.seed;
    da.max_in_flight = cfg.evaluator.in_flight();
    da.max_attempts = cfg.evaluator.max_attempts;
    da.max_queue = cfg.sampler.max_pending;

    // Evaluators first (their workers take a few seconds to import torch), then the rest. In a
    // cluster the head runs its own node's evaluators; the others come with their nodes.
    if (cluster) sa.join_wait_s = cfg.cluster.join_wait_s;
    std::vector<EvaluatorArgs> eval_args;
    std::string worker_logs = (fs::path(run_dir) / "workers").string();
    for (auto& node : cfg.nodes) {
      if (cluster && &node != &head_node(cfg)) continue;
      for (auto& ea : node_evaluators(cfg, node, worker_logs)) eval_args.push_back(ea);
    }

    caf::actor selector, learner;
    if (train) {
      selector = spawn_checkpoint_selector(
          sys, SelectorArgs{(fs::path(run_dir) / "checkpoints").string(), cfg.learner.keep_last});
      LearnerArgs la;
      la.engine = engine;
      la.group_size = cfg.learner.group_size;
      la.selector = selector;
      la.checkpoint_dir = (fs::path(run_dir) / "checkpoints").string();
      la.sync_timeout_s = cfg.learner.sync_timeout_s;
      if (cfg.experiment.mode == Mode::sdpo) {
        la.sdpo_enabled = true;
        la.sdpo.context = cfg.sdpo.context;
        la.sdpo.demonstration = cfg.sdpo.demonstration;
        la.sdpo.beta = cfg.sdpo.beta;
        la.sdpo.max_error_chars = cfg.sdpo.max_error_chars;
        la.teacher_log = (fs::path(run_dir) / "teacher.jsonl").string();
        la.teacher_prompt = [policy = cfg.policy, users = user_messages](const std::string& task,
                                                                         const std::string& section) {
          auto it = users.find(task);
          return render_prompt(policy, teacher_user_message(it == users.end() ? std::string() : it->second, section));
        };
      }
      learner = spawn_learner(sys, la);
      sa.learner = learner;
      sa.selector = selector;
      sa.resume = resume;
      ex.steps = cfg.learner.steps;
      ex.batch_size = cfg.learner.batch_size;  // ttt and sdpo: every task (experiment/adaptation.cpp)
      ex.patience = cfg.experiment.patience;
      ex.group_size = cfg.learner.group_size;
      ex.max_staleness = cfg.learner.max_staleness;
      ex.seed = cfg.experiment.seed;
      for (auto& t : eval_tasks.tasks()) ex.eval_task_ids.push_back(t.id);
      ex.eval_every = cfg.experiment.eval_every;
      ex.eval_samples = cfg.experiment.eval_samples ? cfg.experiment.eval_samples : cfg.learner.group_size;
    }
    auto supervisor = spawn_supervisor(sys, sa);
    auto reward = spawn_reward(sys, cfg.reward, supervisor, caf::actor{});
    auto dispatcher = spawn_dispatcher(sys, da, reward);
    std::vector<caf::actor> evaluators;
    for (auto& ea : eval_args) evaluators.push_back(spawn_evaluator(sys, ea, dispatcher));
    SamplerArgs sma;
    sma.records = std::move(records);
    sma.samples_per_task = cfg.sampler.samples_per_task;
    sma.backend = backend;
    sma.prompts = std::move(prompts);
    sma.params.temperature = cfg.sampler.temperature;
    sma.params.top_p = cfg.sampler.top_p;
    sma.params.max_tokens = cfg.sampler.max_tokens;
    sma.params.stop = cfg.sampler.stop;
    sma.params.seed = cfg.sampler.seed;
    sma.batch_prompts = cfg.sampler.batch_prompts;
    sma.evaluate_top_m = cfg.experiment.evaluate_top_m;
    auto sampler = spawn_sampler(sys, std::move(sma), dispatcher);
    auto stop_all = [&](std::vector<caf::actor> extra) {
      for (auto& a : std::vector<caf::actor>{sampler, dispatcher, reward, supervisor, learner, selector})
        if (a) anon_send_exit(a, caf::exit_reason::user_shutdown);
      for (auto& a : extra) anon_send_exit(a, caf::exit_reason::user_shutdown);
      for (auto& e : evaluators) anon_send_exit(e, caf::exit_reason::user_shutdown);
    };
    MonitorArgs ma;
    ma.progress = cfg.monitor.progress;
    ma.interval_s = cfg.monitor.interval_s;
    ma.metrics_path = (fs::path(run_dir) / cfg.monitor.metrics_file).string();
    ma.label = mode.name;
    if (!cfg.monitor.publish.empty()) {
      std::string perr;
      ma.publisher = TelemetryPublisher::bind(cfg.monitor.publish, perr);
      if (!ma.publisher) {
        lg->error("{}", perr);
        stop_all({});
        return 2;
      }
      lg->info("telemetry published on {} (ZeroMQ PUB, topic \"{}\", msgpack)", ma.publisher->endpoint(),
               telemetry_topic);
    }
    std::vector<caf::actor> watched{supervisor, dispatcher, sampler};
    if (learner) watched.push_back(learner);
    auto monitor = spawn_monitor(sys, ma, watched, supervisor);
    caf::actor gate;
    if (cluster) {
      const auto& head = head_node(cfg);  // it listens on its own host and port
      gate = spawn_gate(sys, GateArgs{cfg.cluster.name, *secret}, dispatcher, supervisor, monitor);
      auto bound = sys.middleman().publish(gate, head.port, head.host.c_str(), true);
      if (!bound) {
        lg->error("cannot listen on {}:{}: {}", head.host, head.port, sys.render(bound.error()));
        stop_all({gate, monitor});
        return 2;
      }
      lg->info(
          "cluster {}: head listening on {}:{}; nodes join with `launch {} --node NAME` (or --join), "
          "monitors attach with `launch monitor {}:{}`",
          cfg.cluster.name, head.host, *bound, config_path, head.host, *bound);
    }

    caf::scoped_actor self{sys};
    std::string summary;
    self->request(supervisor, caf::infinite, plan_atom::value, sampler, evaluators)
        .receive([&](std::string& s) { summary = std::move(s); },
                 [&](caf::error& e) {
                   summary = nlohmann::json{{"ok", false}, {"error", sys.render(e)}}.dump();
                 });
    self->request(monitor, std::chrono::seconds(10), finish_atom::value).receive([](bool) {}, [](caf::error&) {});

    auto j = nlohmann::json::parse(summary);
    if (j.contains("tasks") && j.value("samples", 0) > 0)
      print_summary(j, run_dir);
    else
      std::printf("run directory: %s\n", run_dir.c_str());
    if (j.value("ok", false))
      rc = 0;
    else
      lg->error("run failed: {}", j.value("error", std::string("unknown error")));
    if (gate) sys.middleman().unpublish(gate, 0);
    for (auto& a : std::vector<caf::actor>{monitor, sampler, dispatcher, reward, supervisor, gate, learner, selector})
      if (a) self->send_exit(a, caf::exit_reason::user_shutdown);
    for (auto& e : evaluators) self->send_exit(e, caf::exit_reason::user_shutdown);
  }
  return rc;
}

}  // namespace kernelrl

// launch compare RUN_DIR RUN_DIR ...: runs side by side, refused unless their budgets match.
#include "launch/cli.hpp"
#include "launch/commands.hpp"
#include "analysis/analysis.hpp"
#include "launch/json.hpp"
#include "launch/setup.hpp"
#include "store/store.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <array>
#include <cstdio>
#include <map>
#include <filesystem>
#include <fstream>
#include <iostream>

namespace fs = std::filesystem;

namespace kernelrl {

int cmd_compare(const CompareOptions& o) {
  // Settings that must be equal for a fair comparison, and the compute figure that must match.
  static const std::vector<std::string> same = {"temperature", "top_p",      "max_tokens", "eval_mode",
                                                "model",       "checkpoint", "tasks"};
  struct Run {
    std::string dir;
    nlohmann::json compute, analysis;
    double score = 0;             // fast_1, or the Best-of-Adaptation step's fast_1
    nlohmann::json per_task_boa;  // a per-task run's tasks: each one's Best-of-Adaptation
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
    // (A per-task run's own summary holds the mean over its tasks; its task runs' summaries, one task each.)
    for (auto& id : store->runs()) {
      auto text = store->summary(id);
      if (text.empty()) continue;
      auto sj = nlohmann::json::parse(text, nullptr, false);
      if (!sj.is_object() || !sj.contains("boa")) continue;
      r.score = sj["boa"].value("fast_1", r.score);
      if (sj.value("per_task", false)) {
        r.per_task_boa = sj.value("per_task_boa", nlohmann::json::array());
        break;
      }
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
    if (std::isinf(k) && k < 0)  // below the curve's first point: fewer samples than its k
      return nlohmann::json("< " + fmt::format("{:g}", curve.front().first));
    return std::isfinite(k) ? nlohmann::json(k) : nlohmann::json(nullptr);
  };
  // Per task, best-of-N against Best-of-Adaptation: for each per-task run beside the curve's run, each
  // task's fast_1@K of the best-of-N samples (some sample correct and faster) and its Best-of-
  // Adaptation fast_1, split by the base policy's coverage: whether any of the K samples is correct.
  nlohmann::json per_task = nlohmann::json::array();
  if (ref)
    for (auto& r : runs) {
      if (&r == ref || r.per_task_boa.empty()) continue;
      std::map<std::string, const nlohmann::json*> bon;
      for (auto& t : ref->analysis["per_task"]) bon[t["task_id"].get<std::string>()] = &t;
      nlohmann::json rows = nlohmann::json::array();
      std::map<std::string, std::array<double, 3>> regimes;  // tasks, sum of BoN fast_1@K, of BoA fast_1
      for (auto& t : r.per_task_boa) {
        const std::string id = t["task_id"].get<std::string>();
        auto it = bon.find(id);
        if (it == bon.end()) continue;
        const auto& b = *it->second;
        const bool covered = b.value("correct", uint64_t{0}) > 0;
        const double bon_fast = b["best_speedup"].is_number() && b["best_speedup"].get<double>() > 1.0 ? 1.0 : 0.0;
        const double boa = t.value("boa_fast_1", 0.0);
        rows.push_back({{"task_id", id},
                        {"base_correct_rate", b.value("correct_rate", 0.0)},
                        {"base_fast_1", b.value("fast_1", 0.0)},
                        {"bon_fast_1_at_k", bon_fast},
                        {"boa_fast_1", boa},
                        {"boa_step", t.value("boa_step", 0u)},
                        {"regime", covered ? "covered" : "uncovered"}});
        auto& g = regimes[covered ? "covered" : "uncovered"];
        g[0] += 1;
        g[1] += bon_fast;
        g[2] += boa;
      }
      nlohmann::json by_regime = nlohmann::json::object();
      for (auto& [name, g] : regimes)
        by_regime[name] = {{"tasks", uint64_t(g[0])}, {"bon_fast_1_at_k", g[1] / g[0]}, {"boa_fast_1", g[2] / g[0]}};
      per_task.push_back({{"run_dir", r.dir}, {"bon_run_dir", ref->dir}, {"tasks", rows}, {"regimes", by_regime}});
    }
  if (o.json) {
    nlohmann::json j = {{"differences", differences},
                        {"runs", nlohmann::json::array()},
                        {"per_task_bon_vs_boa", per_task},
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
    std::string eks = ek.is_number()   ? fmt::format("{:.1f}", ek.get<double>())
                      : ek.is_string() ? ek.get<std::string>()
                                       : (curve.empty() ? "-" : "> K");
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
        "score: fast_1 (a train/ttt run: its Best-of-Adaptation step's; a per-task run: the mean over tasks of "
        "each task's); equiv K: the k at which %s's fast_1@k reaches that score\n",
        fs::path(ref->dir).filename().string().c_str());
  for (auto& pt : per_task) {
    std::printf("\nper task: %s's best-of-N (fast_1@K) against %s's Best-of-Adaptation\n%-40s %9s %8s %9s %9s %8s\n",
                fs::path(pt["bon_run_dir"].get<std::string>()).filename().string().c_str(),
                fs::path(pt["run_dir"].get<std::string>()).filename().string().c_str(), "task", "regime", "base c",
                "BoN@K", "BoA", "BoA step");
    for (auto& t : pt["tasks"])
      std::printf("%-40s %9s %8.3f %9.3f %9.3f %8u\n", t["task_id"].get<std::string>().c_str(),
                  t["regime"].get<std::string>().c_str(), t["base_correct_rate"].get<double>(),
                  t["bon_fast_1_at_k"].get<double>(), t["boa_fast_1"].get<double>(), t["boa_step"].get<uint32_t>());
    for (auto& [name, g] : pt["regimes"].items())
      std::printf("%-40s %9s %8s %9.3f %9.3f   (%llu tasks)\n", ("mean, " + name).c_str(), name.c_str(), "",
                  g["bon_fast_1_at_k"].get<double>(), g["boa_fast_1"].get<double>(),
                  (unsigned long long)g["tasks"].get<uint64_t>());
    std::printf(
        "regime: covered when some base sample of the task is correct; base c: the base samples' correct rate\n");
  }
  return 0;
}

void add_compare(CLI::App& app, cli::Action& action) {
  auto o = std::make_shared<CompareOptions>();
  auto* sub = cli::subcommand(app, "compare",
                              "launch compare RUN_DIR RUN_DIR ... [--allow-mismatch] [--json]\n"
                              "  runs side by side; refused when their budgets differ (unless --allow-mismatch)");
  sub->add_option("RUN_DIR", o->run_dirs, "two runs or more")->required()->expected(2, 1 << 20)->type_name("");
  sub->add_flag("--allow-mismatch", o->allow_mismatch, "compare anyway, listing what differs");
  sub->add_flag("--json", o->json, "one JSON object");
  sub->callback([&action, o] { action = [o] { return cmd_compare(*o); }; });
}

}  // namespace kernelrl

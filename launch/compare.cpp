// launch compare RUN_DIR RUN_DIR ...: runs side by side, refused unless their budgets match.
#include "launch/cli.hpp"
#include "launch/commands.hpp"
#include "analysis/analysis.hpp"
#include "analysis/comparison.hpp"
#include "launch/json.hpp"
#include "launch/setup.hpp"
#include "store/store.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <filesystem>
#include <fstream>
#include <iostream>

namespace fs = std::filesystem;

namespace kernelrl {

namespace {

using Run = ComparedRun;

// One finished run: its compute.json, the analysis of its store and its score; 0, or the exit code.
int load_run(Run& r) {
  const std::string& d = r.dir;
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
  // A run's score against another's curve: its Best-of-Adaptation fast_1 when it adapted, a
  // multi-turn inference run's best so far at its last turn (an episode counting as its best
  // attempt: sequential test-time scaling), else its fast_1.
  r.score = r.analysis["fast_1"].get<double>();
  if (r.analysis.contains("turns") && !r.analysis["turns"].empty())
    r.score = r.analysis["turns"].back()["best_so_far"].value("fast_1", r.score);
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
  return 0;
}

// The runs behind a folder given on the command line: the folder itself when it is a run, else its
// seed-S runs (a seeded comparison's arm), in seed order.
std::vector<std::pair<std::string, std::optional<uint64_t>>> runs_in(const std::string& d) {
  std::vector<std::pair<std::string, std::optional<uint64_t>>> out;
  if (fs::exists(fs::path(d) / "compute.json")) return {{d, std::nullopt}};
  std::error_code ec;
  std::vector<std::pair<uint64_t, std::string>> seeded;
  for (auto& e : fs::directory_iterator(d, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("seed-", 0) != 0 || name.size() == 5 ||
        name.find_first_not_of("0123456789", 5) != std::string::npos || !fs::exists(e.path() / "compute.json"))
      continue;
    seeded.emplace_back(std::stoull(name.substr(5)), e.path().string());
  }
  std::sort(seeded.begin(), seeded.end());
  for (auto& [s, p] : seeded) out.emplace_back(p, s);
  return out;
}

void print_json(const std::vector<Run>& runs, const std::vector<std::string>& differences, const Comparison& c) {
  nlohmann::json j = {{"differences", differences},
                      {"runs", nlohmann::json::array()},
                      {"per_task_bon_vs_boa", c.per_task},
                      {"seeds", c.seeds},
                      {"curve_of", c.curve ? nlohmann::json(c.curve->dir) : nlohmann::json(nullptr)}};
  for (auto& r : runs)
    j["runs"].push_back({{"run_dir", r.dir},
                         {"arm", r.arm},
                         {"seed", r.seed ? nlohmann::json(*r.seed) : nlohmann::json(nullptr)},
                         {"compute", r.compute},
                         {"analysis", r.analysis},
                         {"score", r.score},
                         {"equivalent_k", c.equivalent_k(r)},
                         {"matched", c.matched(r)}});
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

void print_table(std::vector<Run>& runs, const Comparison& c) {
  const Run* ref = c.curve;
  const bool seeded = c.seeded;
  std::printf("%-40s %-10s %9s %14s %9s %9s %8s %8s %8s %8s %8s %7s %16s %16s\n", "run", "mode", "rollouts",
              "student tok", "eval s", "learner s", "correct", "fast_1", "fast_1.2", "oracle", "score", "equiv K",
              "curve@rollouts", "curve@tokens");
  for (auto& r : runs) {
    auto& a = r.analysis;
    auto& sel = a["selection"]["strategies"];
    std::string oracle = sel.contains("oracle") ? fmt::format("{:.3f}", sel["oracle"]["fast_1"].get<double>()) : "-";
    auto ek = c.equivalent_k(r);
    std::string eks = ek.is_number()   ? fmt::format("{:.1f}", ek.get<double>())
                      : ek.is_string() ? ek.get<std::string>()
                                       : (ref ? "> K" : "-");
    // The curve's fast_1 at this run's budget a task, in rollouts and in tokens: "value (k)".
    auto m = c.matched(r);
    auto at = [&](const char* v, const char* k) {
      if (m.is_null()) return std::string("-");
      std::string kk = fmt::format("(k {:.1f})", m[k].get<double>());
      if (m[v].is_number()) return fmt::format("{:.3f} {}", m[v].get<double>(), kk);
      return (m[k].get<double>() < 1 ? "< 1 " : "> K ") + kk;  // off the curve: below k = 1 or past its end
    };
    std::printf("%-40s %-10s %9llu %14llu %9.1f %9.1f %8.3f %8.3f %8.3f %8s %8.3f %7s %16s %16s\n", r.label().c_str(),
                r.compute["settings"].value("mode", std::string("?")).c_str(),
                (unsigned long long)r.compute.value("rollouts", uint64_t{0}),
                (unsigned long long)r.compute.value("student_tokens", uint64_t{0}),
                r.compute.value("eval_seconds", 0.0), r.compute.value("learner_seconds", 0.0),
                a["correct_rate"].get<double>(), a["fast_1"].get<double>(), a["fast_1.2"].get<double>(), oracle.c_str(),
                r.score, eks.c_str(), at("fast_1_at_rollouts", "k_rollouts").c_str(),
                at("fast_1_at_tokens", "k_tokens").c_str());
  }
  if (ref)
    std::printf(
        "score: fast_1 (a train/ttt run: its Best-of-Adaptation step's; a per-task run: the mean over tasks of "
        "each task's; a multi-turn run: its episodes' best so far at the last turn); equiv K: the k at which %s's "
        "fast_1@k reaches that score%s; curve@rollouts, curve@tokens: its fast_1@k at the k whose samples cost "
        "as many rollouts a task, and as many tokens a task (prompt and completion), as the run's\n",
        ref->seed ? ref->arm.c_str() : fs::path(ref->dir).filename().string().c_str(),
        seeded ? " (of the same seed)" : "");
}

void print_per_task(const Comparison& c) {
  for (auto& pt : c.per_task) {
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
}

void print_seeds(const Comparison& c) {
  const auto& seeds = c.seeds;
  auto f = [](const nlohmann::json& v, const char* spec) {
    return v.is_number() ? fmt::format(fmt::runtime(spec), v.get<double>()) : std::string("-");
  };
  std::printf("\nover seeds (mean +- standard deviation):\n%-24s %6s %18s %18s %18s\n", "arm", "seeds", "score",
              "fast_1", "correct");
  for (auto& a : seeds["arms"])
    std::printf("%-24s %6llu %18s %18s %18s\n", a["arm"].get<std::string>().c_str(),
                (unsigned long long)a["seeds"].get<uint64_t>(),
                (f(a["score_mean"], "{:.3f}") + " +- " + f(a["score_std"], "{:.3f}")).c_str(),
                (f(a["fast_1_mean"], "{:.3f}") + " +- " + f(a["fast_1_std"], "{:.3f}")).c_str(),
                (f(a["correct_rate_mean"], "{:.3f}") + " +- " + f(a["correct_rate_std"], "{:.3f}")).c_str());
  for (auto& t : seeds["tests"])
    std::printf(
        "%s against %s: score difference %s over %llu paired seeds; paired t %s (p %s), sign-flip p %s, "
        "Welch t %s (p %s)\n",
        t["arm"].get<std::string>().c_str(), t["against"].get<std::string>().c_str(),
        f(t["mean_difference"], "{:+.3f}").c_str(), (unsigned long long)t["paired_seeds"].get<uint64_t>(),
        f(t["paired_t"], "{:.2f}").c_str(), f(t["paired_p"], "{:.3g}").c_str(), f(t["sign_flip_p"], "{:.3g}").c_str(),
        f(t["welch_t"], "{:.2f}").c_str(), f(t["welch_p"], "{:.3g}").c_str());
}

}  // namespace

int cmd_compare(const CompareOptions& o) {
  std::vector<Run> runs;
  for (auto& d : o.run_dirs) {
    auto found = runs_in(d);
    if (found.empty()) {
      std::fprintf(stderr, "launch compare: %s: no compute.json (a run that did not finish?) and no seed-N runs\n",
                   d.c_str());
      return 2;
    }
    for (auto& [dir, seed] : found) {
      Run r;
      r.dir = dir;
      r.arm = fs::path(d).lexically_normal().filename().string();
      if (r.arm.empty()) r.arm = fs::path(d).lexically_normal().parent_path().filename().string();
      r.seed = seed;
      if (int rc = load_run(r)) return rc;
      runs.push_back(std::move(r));
    }
  }
  const auto differences = budget_differences(runs);
  if (!differences.empty() && !o.allow_mismatch) {
    std::fprintf(
        stderr,
        "launch compare: the budgets differ, so the comparison is refused (--allow-mismatch compares anyway):\n");
    for (auto& d : differences) std::fprintf(stderr, "  %s\n", d.c_str());
    return 3;
  }
  for (auto& d : differences) std::fprintf(stderr, "launch compare: warning: %s\n", d.c_str());
  const Comparison c = compare_runs(runs);
  if (o.json) {
    print_json(runs, differences, c);
    return 0;
  }
  print_table(runs, c);
  print_per_task(c);
  if (c.seeded) print_seeds(c);
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

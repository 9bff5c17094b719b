#include "analysis/comparison.hpp"

#include "analysis/analysis.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <map>

namespace kernelrl {

namespace {

nlohmann::json num_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

// j[key], or null where j has no such key (the runs are const here: operator[] would not insert it).
const nlohmann::json& field(const nlohmann::json& j, const std::string& key) {
  static const nlohmann::json none;
  auto it = j.find(key);
  return it == j.end() ? none : *it;
}

const ComparedRun& first_of_seed(const std::vector<ComparedRun>& runs, const ComparedRun& r) {
  for (auto& x : runs)
    if (x.seed == r.seed) return x;
  return runs.front();
}

// Per task, best-of-N against Best-of-Adaptation: for each per-task run beside its curve's run, each
// task's fast_1@K of the best-of-N samples (some sample correct and faster) and its Best-of-
// Adaptation fast_1, split by the base policy's coverage: whether any of the K samples is correct.
nlohmann::json per_task_bon_vs_boa(const Comparison& c) {
  nlohmann::json out = nlohmann::json::array();
  for (auto& r : *c.runs) {
    const ComparedRun* rf = c.curve_of(r);
    if (!rf || &r == rf || r.per_task_boa.empty()) continue;
    std::map<std::string, const nlohmann::json*> bon;
    for (auto& t : field(rf->analysis, "per_task")) bon[t["task_id"].get<std::string>()] = &t;
    nlohmann::json rows = nlohmann::json::array();
    std::map<std::string, std::array<double, 3>> regimes;  // tasks, sum of BoN fast_1@K, of BoA fast_1
    for (auto& t : r.per_task_boa) {
      const std::string id = t["task_id"].get<std::string>();
      auto it = bon.find(id);
      if (it == bon.end()) continue;
      const auto& b = *it->second;
      const bool covered = b.value("correct", uint64_t{0}) > 0;
      const double bon_fast =
          field(b, "best_speedup").is_number() && field(b, "best_speedup").get<double>() > 1.0 ? 1.0 : 0.0;
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
    out.push_back({{"run_dir", r.dir}, {"bon_run_dir", rf->dir}, {"tasks", rows}, {"regimes", by_regime}});
  }
  return out;
}

// Seeded arms: each arm's mean and standard deviation over its seeds, and each arm against the
// first (paired t, Welch's t and the sign-flip test on the scores).
nlohmann::json seed_statistics(const Comparison& c) {
  const auto& runs = *c.runs;
  std::vector<std::string> arms;
  for (auto& r : runs)
    if (std::find(arms.begin(), arms.end(), r.arm) == arms.end()) arms.push_back(r.arm);
  auto scores_of = [&](const std::string& arm, const char* key) {
    std::map<uint64_t, double> out;
    for (auto& r : runs)
      if (r.arm == arm && r.seed)
        out[*r.seed] = std::string(key) == "score" ? r.score : field(r.analysis, key).get<double>();
    return out;
  };
  auto stats = [](const std::map<uint64_t, double>& v) {
    double m = 0, s = 0;
    for (auto& [k, x] : v) m += x / double(v.size());
    for (auto& [k, x] : v) s += (x - m) * (x - m);
    return std::make_pair(m, v.size() > 1 ? std::sqrt(s / double(v.size() - 1)) : std::nan(""));
  };
  nlohmann::json seeds = {{"arms", nlohmann::json::array()}, {"tests", nlohmann::json::array()}};
  for (auto& arm : arms) {
    nlohmann::json a = {{"arm", arm}, {"runs", nlohmann::json::array()}};
    for (const char* key : {"score", "fast_1", "correct_rate"}) {
      auto [m, sd] = stats(scores_of(arm, key));
      a[std::string(key) + "_mean"] = num_or_null(m);
      a[std::string(key) + "_std"] = num_or_null(sd);
    }
    for (auto& r : runs)
      if (r.arm == arm && r.seed)
        a["runs"].push_back({{"seed", *r.seed},
                             {"run_dir", r.dir},
                             {"score", r.score},
                             {"fast_1", field(r.analysis, "fast_1")},
                             {"equivalent_k", c.equivalent_k(r)}});
    a["seeds"] = a["runs"].size();
    seeds["arms"].push_back(a);
  }
  const auto base = scores_of(arms.front(), "score");
  for (size_t i = 1; i < arms.size(); ++i) {
    const auto mine = scores_of(arms[i], "score");
    std::vector<double> a, b, a_all, b_all;  // paired over the seeds both ran; Welch over all
    for (auto& [s, x] : mine) {
      a_all.push_back(x);
      if (base.count(s)) {
        a.push_back(x);
        b.push_back(base.at(s));
      }
    }
    for (auto& [s, x] : base) b_all.push_back(x);
    auto paired = seed_tests(a, b), welch = seed_tests(a_all, b_all);
    seeds["tests"].push_back({{"arm", arms[i]},
                              {"against", arms.front()},
                              {"paired_seeds", paired.n},
                              {"mean_difference", num_or_null(paired.mean_difference)},
                              {"paired_t", num_or_null(paired.paired_t)},
                              {"paired_p", num_or_null(paired.paired_p)},
                              {"sign_flip_p", num_or_null(paired.sign_flip_p)},
                              {"welch_t", num_or_null(welch.welch_t)},
                              {"welch_df", num_or_null(welch.welch_df)},
                              {"welch_p", num_or_null(welch.welch_p)}});
  }
  return seeds;
}

}  // namespace

std::string ComparedRun::label() const {
  return seed ? arm + "/seed-" + std::to_string(*seed) : std::filesystem::path(dir).filename().string();
}

std::vector<std::string> budget_differences(const std::vector<ComparedRun>& runs) {
  // Settings that must be equal for a fair comparison; the strategies (modes, K per step) may differ.
  static const std::vector<std::string> same = {"temperature", "top_p",      "max_tokens", "eval_mode",
                                                "model",       "checkpoint", "tasks"};
  auto setting = [](const ComparedRun& x, const std::string& k) {
    const auto& st = x.compute.value("settings", nlohmann::json::object());
    if (!st.contains(k)) return std::string("(unset)");
    const auto v = st[k].get<std::string>();
    return v.empty() ? std::string("\"\" (empty)") : v;
  };
  auto rollouts = [](const ComparedRun& x) { return x.compute.value("rollouts", uint64_t{0}); };
  std::vector<std::string> differences;
  for (auto& r : runs) {
    const ComparedRun& first = first_of_seed(runs, r);
    if (&first == &r) continue;
    for (auto& k : same)
      if (setting(first, k) != setting(r, k))
        differences.push_back(
            fmt::format("{}: {} in {} but {} in {}", k, setting(first, k), first.dir, setting(r, k), r.dir));
    if (rollouts(first) != rollouts(r))
      differences.push_back(
          fmt::format("rollouts: {} in {} but {} in {}", rollouts(first), first.dir, rollouts(r), r.dir));
  }
  return differences;
}

const ComparedRun* Comparison::curve_of(const ComparedRun& r) const {
  if (!curve || !r.seed) return curve;
  for (auto& x : *runs)
    if (x.arm == curve->arm && x.seed == r.seed) return &x;
  return curve;
}

nlohmann::json Comparison::equivalent_k(const ComparedRun& r) const {
  std::vector<std::pair<double, double>> points;
  if (const ComparedRun* x = curve_of(r))
    for (auto& a : field(x->analysis, "at_k"))
      if (a["fast_1"].is_number()) points.emplace_back(a["k"].get<double>(), a["fast_1"].get<double>());
  if (points.empty()) return nullptr;
  double k = kernelrl::equivalent_k(points, r.score);
  if (std::isinf(k) && k < 0)  // below the curve's first point: fewer samples than its k
    return nlohmann::json("< " + fmt::format("{:g}", points.front().first));
  return std::isfinite(k) ? nlohmann::json(k) : nlohmann::json(nullptr);
}

Comparison compare_runs(const std::vector<ComparedRun>& runs) {
  Comparison c;
  c.runs = &runs;
  for (auto& r : runs)
    if (!c.curve && field(r.analysis, "at_k").size() >= 2 && !r.analysis.contains("turns")) c.curve = &r;
  c.per_task = per_task_bon_vs_boa(c);
  for (auto& r : runs) c.seeded = c.seeded || r.seed.has_value();
  if (c.seeded) c.seeds = seed_statistics(c);
  return c;
}

}  // namespace kernelrl

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

// One test's row: the paired figures of `paired`, Welch's of `welch`.
nlohmann::json test_json(const std::string& arm, const std::string& against, const SeedTests& paired,
                         const SeedTests& welch) {
  return {{"arm", arm},
          {"against", against},
          {"paired_seeds", paired.n},
          {"mean_difference", num_or_null(paired.mean_difference)},
          {"paired_t", num_or_null(paired.paired_t)},
          {"paired_p", num_or_null(paired.paired_p)},
          {"sign_flip_p", num_or_null(paired.sign_flip_p)},
          {"welch_t", num_or_null(welch.welch_t)},
          {"welch_df", num_or_null(welch.welch_df)},
          {"welch_p", num_or_null(welch.welch_p)}};
}

// Seeded arms: each arm's mean and standard deviation over its seeds, each arm against the first
// (paired t, Welch's t and the sign-flip test on the scores), and each arm against the curve's
// fast_1@k at its own rollouts and tokens a task (matched_budgets), paired by seed.
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
                             {"equivalent_k", c.equivalent_k(r)},
                             {"matched", c.matched(r)}});
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
    seeds["tests"].push_back(test_json(arms[i], arms.front(), seed_tests(a, b), seed_tests(a_all, b_all)));
  }
  // Each arm read on the curve of its seed (best-of-N's fast_1@k) at its own budget: its score
  // against the curve's value at its rollouts a task and at its tokens a task, paired by seed.
  for (auto& arm : arms)
    for (auto [which, key] : {std::pair{"rollouts", "fast_1_at_rollouts"}, std::pair{"tokens", "fast_1_at_tokens"}}) {
      std::vector<double> a, b;
      std::string curve_arm;
      for (auto& r : runs) {
        if (r.arm != arm || !r.seed) continue;
        auto m = c.matched(r);
        if (!m.is_object() || !m[key].is_number()) continue;
        a.push_back(r.score);
        b.push_back(m[key].get<double>());
        curve_arm = c.curve_of(r)->arm;
      }
      if (a.empty()) continue;
      auto paired = seed_tests(a, b);
      seeds["tests"].push_back(
          test_json(arm, fmt::format("{}'s fast_1@k at equal {}", curve_arm, which), paired, paired));
    }
  return seeds;
}

}  // namespace

std::string ComparedRun::label() const {
  return seed ? arm + "/seed-" + std::to_string(*seed) : std::filesystem::path(dir).filename().string();
}

bool draws(const ComparedRun& r) { return field(r.analysis, "at_k").size() >= 2 && !r.analysis.contains("turns"); }

bool sequential(const ComparedRun& r) { return !field(r.analysis, "turns").empty(); }

namespace {

// fast_1@k on the curve's points (k = 1, 2, ..., K), linear between whole k; NaN past K or below 1.
double curve_at(const nlohmann::json& at_k, double k) {
  std::vector<std::pair<double, double>> pts;
  for (auto& a : at_k)
    if (a["fast_1"].is_number()) pts.emplace_back(a["k"].get<double>(), a["fast_1"].get<double>());
  for (size_t i = 0; i < pts.size(); ++i) {
    if (std::abs(pts[i].first - k) < 1e-9) return pts[i].second;
    if (i + 1 < pts.size() && pts[i].first < k && k < pts[i + 1].first) {
      double w = (k - pts[i].first) / (pts[i + 1].first - pts[i].first);
      return pts[i].second + w * (pts[i + 1].second - pts[i].second);
    }
  }
  return std::nan("");
}

}  // namespace

nlohmann::json matched_budgets(const ComparedRun& r, const ComparedRun& curve) {
  const double tasks = field(r.analysis, "tasks").is_number() ? r.analysis["tasks"].get<double>() : 0;
  const double rollouts = double(r.compute.value("rollouts", uint64_t{0}));
  const double tokens = double(r.compute.value("student_tokens", uint64_t{0}));
  const double c_rollouts = double(curve.compute.value("rollouts", uint64_t{0}));
  const double c_tokens = double(curve.compute.value("student_tokens", uint64_t{0}));
  if (tasks <= 0 || rollouts <= 0 || tokens <= 0 || c_rollouts <= 0 || c_tokens <= 0) return nullptr;
  const auto& at_k = field(curve.analysis, "at_k");
  const double k_max = at_k.empty() ? 0 : at_k.back().value("k", 0.0);
  const double k_rollouts = rollouts / tasks, k_tokens = (tokens / tasks) / (c_tokens / c_rollouts);
  return {{"curve", curve.dir},
          {"k_rollouts", k_rollouts},
          {"fast_1_at_rollouts", num_or_null(curve_at(at_k, k_rollouts))},
          {"k_tokens", k_tokens},
          {"fast_1_at_tokens", num_or_null(curve_at(at_k, k_tokens))},
          {"curve_k", k_max},
          {"reaches", k_rollouts >= 1 && k_tokens >= 1 && k_rollouts <= k_max + 1e-9 && k_tokens <= k_max + 1e-9}};
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
    if (sequential(first) != sequential(r) && (draws(first) || draws(r))) {
      // Sequential refinement against independent draws: read on the draws' curve at both budgets.
      const ComparedRun& seq = sequential(r) ? r : first;
      const ComparedRun& bon = sequential(r) ? first : r;
      auto m = matched_budgets(seq, bon);
      if (m.is_null())
        differences.push_back(
            fmt::format("tokens: {} or {} has no tasks, rollouts or tokens to match", seq.dir, bon.dir));
      else if (std::min(m["k_rollouts"].get<double>(), m["k_tokens"].get<double>()) < 1)
        differences.push_back(fmt::format(
            "rollouts and tokens: {} spends less than one sample a task of {} ({:.2f} in rollouts, {:.2f} in tokens)",
            seq.dir, bon.dir, m["k_rollouts"].get<double>(), m["k_tokens"].get<double>()));
      else if (!m["reaches"].get<bool>())
        differences.push_back(fmt::format(
            "rollouts and tokens: {} spends as much as {:.1f} samples a task in rollouts and {:.1f} in tokens (prompt "
            "and completion) of {}, whose fast_1@k curve ends at k = {:g}: evaluate it with at least k = {:g}",
            seq.dir, m["k_rollouts"].get<double>(), m["k_tokens"].get<double>(), bon.dir, m["curve_k"].get<double>(),
            std::ceil(std::max(m["k_rollouts"].get<double>(), m["k_tokens"].get<double>()))));
    } else if (rollouts(first) != rollouts(r)) {
      differences.push_back(
          fmt::format("rollouts: {} in {} but {} in {}", rollouts(first), first.dir, rollouts(r), r.dir));
    }
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

nlohmann::json Comparison::matched(const ComparedRun& r) const {
  const ComparedRun* x = curve_of(r);
  if (!x || x == &r || x->seed != r.seed) return nullptr;  // (a seeded run: only its own seed's curve)
  return matched_budgets(r, *x);
}

Comparison compare_runs(const std::vector<ComparedRun>& runs) {
  Comparison c;
  c.runs = &runs;
  for (auto& r : runs)
    if (!c.curve && draws(r)) c.curve = &r;
  c.per_task = per_task_bon_vs_boa(c);
  for (auto& r : runs) c.seeded = c.seeded || r.seed.has_value();
  if (c.seeded) c.seeds = seed_statistics(c);
  return c;
}

}  // namespace kernelrl

// Runs compared side by side (`launch compare`, torch-free): the budget checks that decide whether
// a comparison is fair, equivalent K on a best-of-N run's fast_1@k curve, each task's best-of-N
// against its Best-of-Adaptation, and seeded arms' means with their tests against the first arm.
// launch/compare.cpp loads the runs and prints what this computes.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kernelrl {

struct ComparedRun {
  std::string dir;
  std::string arm;               // the folder named on the command line
  std::optional<uint64_t> seed;  // a run of a seeded comparison: ARM/seed-S
  nlohmann::json compute;        // its compute.json
  nlohmann::json analysis;       // analyze() of its samples
  double score = 0;              // fast_1, or the Best-of-Adaptation step's fast_1
  nlohmann::json per_task_boa;   // a per-task run's tasks: each one's Best-of-Adaptation
  std::string label() const;     // ARM/seed-S, or the run folder's name
};

// What must match for a fair comparison, each run against the first run of its seed (of the whole
// list without seeds): the settings named here and the rollouts spent. A sequential (multi-turn)
// run beside independent draws (best-of-N, `draws`) is matched on the draws' fast_1@k curve
// instead, at its rollouts and at its tokens a task (`matched_budgets`): a difference only when
// the curve does not reach them. One line per difference.
std::vector<std::string> budget_differences(const std::vector<ComparedRun>& runs);

// A run of independent draws: at least two samples a task, not multi-turn (a curve to read).
bool draws(const ComparedRun& r);
// A multi-turn run (its later turns read the earlier ones: more prompt tokens a rollout).
bool sequential(const ComparedRun& r);

// `r`'s budget a task in samples of `curve` (independent draws): `k_rollouts`, its rollouts a task,
// and `k_tokens`, its tokens a task (prompt and completion, compute.json's student_tokens) over
// the curve's tokens a sample; with `curve`'s fast_1@k at each (linear between whole k), null
// where k is past the curve's last point. `reaches`: both within the curve. Null when either run
// has no tasks or tokens to count.
nlohmann::json matched_budgets(const ComparedRun& r, const ComparedRun& curve);

struct Comparison {
  const std::vector<ComparedRun>* runs = nullptr;
  // The first sampled run with at least two samples per task (a best-of-N or eval run of K
  // samples; never a multi-turn run, whose samples of a task are not independent draws): each
  // run's score is placed on its fast_1@k curve (that arm's run of the same seed, when seeded).
  const ComparedRun* curve = nullptr;
  nlohmann::json per_task = nlohmann::json::array();  // per_task_bon_vs_boa rows
  nlohmann::json seeds = nullptr;                     // {"arms": [...], "tests": [...]} when seeded
  bool seeded = false;
  // Where r's score falls on the curve: a k, "< K" below its first point, null when never reached.
  nlohmann::json equivalent_k(const ComparedRun& r) const;
  // matched_budgets(r, its curve); null for the curve itself, without one, or (seeded) without
  // the curve arm's run of r's seed.
  nlohmann::json matched(const ComparedRun& r) const;
  const ComparedRun* curve_of(const ComparedRun& r) const;
};
Comparison compare_runs(const std::vector<ComparedRun>& runs);

}  // namespace kernelrl

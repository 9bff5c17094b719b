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
// list without seeds): the settings named here and the rollouts spent. One line per difference.
std::vector<std::string> budget_differences(const std::vector<ComparedRun>& runs);

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
  const ComparedRun* curve_of(const ComparedRun& r) const;
};
Comparison compare_runs(const std::vector<ComparedRun>& runs);

}  // namespace kernelrl

#pragma once
// An experiment's scoring of its samples, without actors: per-task aggregates, a step's (or a
// round's) statistics from them, the reward histogram's bins and quantiles of the speedups.

#include "messages/messages.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kernelrl {

// One task's samples so far.
struct TaskAgg {
  uint64_t samples = 0, correct = 0, faster = 0;  // faster: correct with speedup > 1
  double speedup_sum = 0, reward_sum = 0;         // speedups of correct samples; every reward
};

// Adds a sample to its task's aggregate; a sample without a verdict (skipped, or too large for
// the device) counts in no rate.
void add_to(std::map<std::string, TaskAgg>& tasks, const ScoredRollout& s);

// The statistics of `step` from its tasks' aggregates: samples, correct, fast_1 (faster over
// samples), mean speedup of correct samples, mean reward, the status counts.
StepStats stats_of(const std::map<std::string, TaskAgg>& tasks, const std::map<std::string, uint64_t>& status_counts,
                   uint32_t step);

// Names of the reward histogram's bins, in order: its telemetry keys are "reward_hist.NAME".
const std::vector<std::string>& reward_histogram_bins();
// The bin of reward r: (-inf, 0], (0, 0.5], (0.5, 1], (1, 1.5], (1.5, 2], (2, 5], (5, inf).
size_t reward_bin(double r);

// Multi-turn episodes: a turn's group in episode order (by sample index).
void sort_by_sample_index(std::vector<ScoredRollout>& group);
// The plan of a task's next turn, one group of n samples: each episode j < n with its attempt in
// each of `turns` (the earlier turns' groups, each in episode order) and the evaluator's feedback
// on it (feedback_text).
SamplePlan next_turn_plan(uint32_t step, const std::string& task_id, uint64_t group_id, uint32_t n,
                          const std::vector<std::vector<ScoredRollout>>& turns, size_t feedback_chars);

// The q-quantile (0..1, nearest rank) of xs; xs is reordered.
double quantile(std::vector<double>& xs, double q);

}  // namespace kernelrl

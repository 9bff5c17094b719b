#include "experiment/scores.hpp"

#include "tasks/prompt.hpp"

#include <algorithm>

namespace kernelrl {

namespace {
const std::vector<double> reward_edges = {0, 0.5, 1, 1.5, 2, 5};
}  // namespace

void add_to(std::map<std::string, TaskAgg>& tasks, const ScoredRollout& s) {
  if (!is_verdict(s.result.status)) return;
  auto& t = tasks[s.rollout.task_id];
  ++t.samples;
  t.reward_sum += s.reward;
  if (s.result.status == EvalStatus::ok) {
    ++t.correct;
    t.speedup_sum += s.result.speedup;
    if (s.result.speedup > 1.0) ++t.faster;
  } else if (s.result.status == EvalStatus::unconfirmed) {
    ++t.correct;  // correct, its speed not believed until confirmed: counted as not faster
    t.speedup_sum += std::min(s.result.speedup, 1.0);
  }
}

StepStats stats_of(const std::map<std::string, TaskAgg>& tasks, const std::map<std::string, uint64_t>& status_counts,
                   uint32_t step) {
  StepStats s;
  s.step = step;
  uint64_t faster = 0;
  double speedup_sum = 0, reward_sum = 0;
  for (auto& [id, t] : tasks) {
    s.samples += t.samples;
    s.correct += t.correct;
    faster += t.faster;
    speedup_sum += t.speedup_sum;
    reward_sum += t.reward_sum;
  }
  s.fast_1 = s.samples ? double(faster) / double(s.samples) : 0.0;
  s.mean_speedup = s.correct ? speedup_sum / double(s.correct) : 0.0;
  s.mean_reward = s.samples ? reward_sum / double(s.samples) : 0.0;
  s.status_counts = status_counts;
  return s;
}

const std::vector<std::string>& reward_histogram_bins() {
  static const std::vector<std::string> bins = {"le_0", "0_0.5", "0.5_1", "1_1.5", "1.5_2", "2_5", "gt_5"};
  return bins;
}

size_t reward_bin(double r) {
  size_t i = 0;
  while (i < reward_edges.size() && r > reward_edges[i]) ++i;
  return i;
}

double quantile(std::vector<double>& xs, double q) {
  if (xs.empty()) return 0;
  size_t k = std::min(xs.size() - 1, static_cast<size_t>(q * double(xs.size() - 1) + 0.5));
  std::nth_element(xs.begin(), xs.begin() + k, xs.end());
  return xs[k];
}

void sort_by_sample_index(std::vector<ScoredRollout>& group) {
  std::sort(group.begin(), group.end(), [](const ScoredRollout& a, const ScoredRollout& b) {
    return a.rollout.sample_index < b.rollout.sample_index;
  });
}

SamplePlan next_turn_plan(uint32_t step, const std::string& task_id, uint64_t group_id, uint32_t n,
                          const std::vector<std::vector<ScoredRollout>>& turns, size_t feedback_chars) {
  SamplePlan plan;
  plan.step = step;
  plan.n = n;
  plan.turn = uint32_t(turns.size()) + 1;
  plan.task_ids = {task_id};
  plan.group_ids = {group_id};
  plan.history.resize(n);
  for (uint32_t j = 0; j < n; ++j)
    for (auto& turn : turns)
      if (j < turn.size())
        plan.history[j].push_back(
            {turn[j].rollout.sample_id, turn[j].rollout.completion, feedback_text(turn[j].result, feedback_chars)});
  return plan;
}

}  // namespace kernelrl

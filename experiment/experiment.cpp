#include "experiment/experiment.hpp"

#include "core/paths.hpp"
#include "experiment/refinement.hpp"
#include "experiment/sample_all.hpp"
#include "experiment/training.hpp"

#include <algorithm>

namespace kernelrl {

void RunTotals::count(const ScoredRollout& s, double now) {
  ++recorded;
  t_last_record = now;
  if (t_first_record < 0) t_first_record = now;
  student_tokens += s.rollout.token_ids.size();
  student_prompt_tokens += s.rollout.prompt_tokens;
  eval_wall_s += s.result.wall_s;
  compile_s += s.result.compile_s;
  if (s.result.device_start > 0 && s.result.device_end > s.result.device_start)
    eval_device_s += s.result.device_end - s.result.device_start;
  if (!s.rollout.split.empty()) {
    ++eval_rollouts;
    return;
  }
  ++status_counts[to_string(s.result.status)];
  if (reward_hist.empty()) reward_hist.assign(reward_histogram_bins().size(), 0);
  if (is_verdict(s.result.status)) ++reward_hist[reward_bin(s.reward)];
  step = std::max(step, s.rollout.step);
  policy_version = std::max(policy_version, s.rollout.policy_version);
  uint64_t stale = policy_version - s.rollout.policy_version;
  stale_max = std::max(stale_max, stale);
  stale_sum += stale;
  add_to(tasks, s);
  if (s.result.status == EvalStatus::ok) speedups.push_back(s.result.speedup);
}

nlohmann::json tasks_json(const std::vector<std::string>& order, const std::map<std::string, TaskAgg>& tasks) {
  nlohmann::json out = nlohmann::json::array();
  for (auto& id : order) {
    auto it = tasks.find(id);
    TaskAgg t = it == tasks.end() ? TaskAgg{} : it->second;
    out.push_back({{"task_id", id},
                   {"samples", t.samples},
                   {"correct", t.correct},
                   {"fast_1", t.samples ? double(t.faster) / double(t.samples) : 0.0},
                   {"mean_speedup", t.correct ? t.speedup_sum / double(t.correct) : 0.0}});
  }
  for (auto& [id, t] : tasks)  // samples of tasks outside the task set (failed lookups)
    if (std::find(order.begin(), order.end(), id) == order.end())
      out.push_back(
          {{"task_id", id}, {"samples", t.samples}, {"correct", t.correct}, {"fast_1", 0.0}, {"mean_speedup", 0.0}});
  return out;
}

Experiment::Experiment(ExperimentArgs args) : args_(std::move(args)) { totals_.t_start = mono_s(); }

Actions Experiment::updated(const StepUpdate&) { return {}; }

nlohmann::json Experiment::summary(const std::string& error, const std::vector<Store::StepRow>& step_rows) {
  const RunTotals& t = totals_;
  StepStats s = stats_of(t.tasks, t.status_counts, 0);
  nlohmann::json j;
  j["run_id"] = args_.run_id;
  j["mode"] = name(args_.mode);
  j["ok"] = error.empty();
  j["error"] = error;
  j["expected"] = t.expected;
  j["samples"] = s.samples;
  j["correct"] = s.correct;
  j["fast_1"] = s.fast_1;
  j["mean_speedup"] = s.mean_speedup;
  j["mean_reward"] = s.mean_reward;
  j["status_counts"] = s.status_counts;
  j["wall_s"] = mono_s() - t.t_start;
  // From the first sample stored to the last: the pipeline's pace once work flows.
  j["record_span_s"] = t.t_first_record < 0 ? 0.0 : t.t_last_record - t.t_first_record;
  j["tasks"] = tasks_json(args_.task_ids, t.tasks);
  // The compute the run spent, with the settings that make two runs' budgets comparable.
  double learner_s = 0, teacher_tokens = 0;
  for (auto& row : step_rows) {
    auto it = row.learner.find("learner_s");
    if (it != row.learner.end()) learner_s += it->second;
    it = row.learner.find("teacher_tokens");
    if (it != row.learner.end()) teacher_tokens += it->second;
  }
  auto skipped = t.status_counts.find("skipped");
  const uint64_t evaluations = t.recorded - (skipped == t.status_counts.end() ? 0 : skipped->second);
  j["compute"] = {{"rollouts", t.recorded},
                  {"evaluations", evaluations},
                  {"eval_split_rollouts", t.eval_rollouts},
                  {"student_prompt_tokens", t.student_prompt_tokens},
                  {"student_completion_tokens", t.student_tokens},
                  {"student_tokens", t.student_prompt_tokens + t.student_tokens},
                  {"total_tokens", t.student_prompt_tokens + t.student_tokens + uint64_t(teacher_tokens)},
                  {"teacher_tokens", uint64_t(teacher_tokens)},
                  {"eval_seconds", t.eval_wall_s},
                  {"eval_device_seconds", t.eval_device_s},
                  {"compile_seconds", t.compile_s},
                  {"learner_seconds", learner_s},
                  {"settings", args_.settings}};
  return j;
}

std::map<std::string, double> Experiment::telemetry() const {
  const RunTotals& t = totals_;
  StepStats s = stats_of(t.tasks, t.status_counts, 0);
  const double elapsed = mono_s() - t.t_start;
  const double rate = elapsed > 0 ? double(t.recorded) / elapsed : 0.0;
  std::map<std::string, double> v = {{"samples_done", double(t.recorded)},
                                     {"samples_total", double(t.expected)},
                                     {"correct", double(s.correct)},
                                     {"fast_1", s.fast_1},
                                     {"mean_reward", s.mean_reward},
                                     {"mean_speedup", s.mean_speedup},
                                     {"samples_per_s", rate},
                                     {"eta_s", rate > 0 ? double(outstanding()) / rate : -1.0},
                                     {"elapsed_s", elapsed},
                                     {"step", double(t.step)},
                                     {"policy_version", double(t.policy_version)},
                                     {"staleness_max", double(t.stale_max)},
                                     {"staleness_mean", t.recorded ? double(t.stale_sum) / double(t.recorded) : 0.0},
                                     {"correct_rate", t.recorded ? double(s.correct) / double(t.recorded) : 0.0}};
  for (auto& [k, n] : t.status_counts) v["status." + k] = double(n);
  auto xs = t.speedups;
  for (auto [q_name, q] : std::initializer_list<std::pair<const char*, double>>{
           {"p10", 0.1}, {"p25", 0.25}, {"p50", 0.5}, {"p75", 0.75}, {"p90", 0.9}, {"max", 1.0}})
    v[std::string("speedup.") + q_name] = quantile(xs, q);
  for (size_t i = 0; i < reward_histogram_bins().size(); ++i)
    v["reward_hist." + reward_histogram_bins()[i]] = t.reward_hist.empty() ? 0.0 : double(t.reward_hist[i]);
  return v;
}

std::unique_ptr<Experiment> make_experiment(ExperimentArgs args) {
  std::unique_ptr<Experiment> e;
  switch (args.mode) {
    case Mode::eval:
    case Mode::best_of_n:
      if (args.turns > 1)
        e = std::make_unique<Refinement>(std::move(args));
      else
        e = std::make_unique<SampleAll>(std::move(args));
      break;
    case Mode::train:
      e = std::make_unique<Training>(std::move(args));
      break;
    case Mode::ttt:
    case Mode::sdpo:
      e = std::make_unique<Adaptation>(std::move(args));
      break;
  }
  return e;
}

}  // namespace kernelrl

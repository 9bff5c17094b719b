#include "experiment/held_out.hpp"

#include "core/log.hpp"
#include "core/paths.hpp"

#include <algorithm>
#include <filesystem>
#include <set>

namespace kernelrl {

Actions HeldOutRounds::plan(uint32_t v) {
  if (task_ids_.empty()) return {};
  auto& r = rounds_[v];
  if (r.expected > 0) return {};
  Actions out{act::Keep{v}};  // its checkpoint stays with its score
  std::set<std::string> done;
  for (auto& [gid, g] : r.groups)
    if (g.second >= samples_) done.insert(g.first);
  SamplePlan plan;
  plan.step = v;
  plan.n = samples_;
  plan.split = "eval";
  for (auto& t : task_ids_) {
    if (done.count(t)) continue;
    plan.task_ids.push_back(t);
    plan.group_ids.push_back(group_base + uint64_t(v) * group_stride + r.next_j++);
  }
  r.expected = r.recorded + uint64_t(plan.task_ids.size()) * samples_;
  log::get("supervisor")
      ->info("eval of policy version {}: {} held-out tasks x {} samples", v, plan.task_ids.size(), samples_);
  if (!plan.task_ids.empty())
    out.push_back(act::Sample{std::move(plan)});
  else
    progress(v);
  return out;
}

void HeldOutRounds::add(const ScoredRollout& s) {
  auto& r = rounds_[s.rollout.step];
  ++r.recorded;
  add_to(r.tasks, s);
  ++r.status_counts[to_string(s.result.status)];
  r.min_version = std::min(r.min_version, s.rollout.policy_version);
  r.max_version = std::max(r.max_version, s.rollout.policy_version);
  auto& g = r.groups[s.rollout.group_id];
  g.first = s.rollout.task_id;
  ++g.second;
  r.next_j = std::max(r.next_j, s.rollout.group_id % group_stride + 1);
}

void HeldOutRounds::progress(uint32_t v) {
  auto& r = rounds_[v];
  if (r.expected == 0 || r.recorded < r.expected || r.reported) return;
  r.reported = true;
  StepStats s = stats_of(r.tasks, r.status_counts, v);
  last_fast_1_ = s.fast_1;
  last_version_ = v;
  log::get("supervisor")
      ->info("eval of policy version {}: {} samples over {} held-out tasks, correct {:.3f}, fast_1 {:.3f}", v,
             s.samples, r.tasks.size(), s.samples ? double(s.correct) / double(s.samples) : 0.0, s.fast_1);
}

bool HeldOutRounds::done() const {
  for (auto& [v, r] : rounds_)
    if (r.recorded < r.expected) return false;
  return true;
}

nlohmann::json HeldOutRounds::round_json(uint32_t version, const Round& r, const std::string& checkpoints) const {
  StepStats s = stats_of(r.tasks, r.status_counts, version);
  nlohmann::json tasks = nlohmann::json::array();
  for (auto& [id, t] : r.tasks)
    tasks.push_back({{"task_id", id},
                     {"samples", t.samples},
                     {"correct", t.correct},
                     {"fast_1", t.samples ? double(t.faster) / double(t.samples) : 0.0}});
  nlohmann::json j = {{"policy_version", version},
                      {"samples", s.samples},
                      {"correct", s.correct},
                      {"correct_rate", s.samples ? double(s.correct) / double(s.samples) : 0.0},
                      {"fast_1", s.fast_1},
                      {"mean_speedup", s.mean_speedup},
                      {"mean_reward", s.mean_reward},
                      {"status_counts", s.status_counts},
                      {"tasks", tasks}};
  if (r.recorded > 0) j["sampled_by_versions"] = {r.min_version, r.max_version};
  auto dir = checkpoint_dir(checkpoints, version);
  if (std::filesystem::exists(dir)) j["checkpoint"] = dir;
  return j;
}

void HeldOutRounds::summarize(nlohmann::json& j, const std::string& checkpoints) const {
  if (task_ids_.empty()) return;
  nlohmann::json rounds = nlohmann::json::array();
  size_t best = 0;
  for (auto& [v, r] : rounds_) {
    if (r.recorded == 0) continue;
    rounds.push_back(round_json(v, r, checkpoints));
    if (rounds.back()["fast_1"].get<double>() > rounds[best]["fast_1"].get<double>()) best = rounds.size() - 1;
  }
  if (!rounds.empty()) {  // the earliest on a tie
    j["eval_best"] = {{"policy_version", rounds[best]["policy_version"]}, {"fast_1", rounds[best]["fast_1"]}};
    if (rounds[best].contains("checkpoint")) j["eval_best"]["checkpoint"] = rounds[best]["checkpoint"];
  }
  j["eval"] = rounds;
  j["eval_tasks"] = task_ids_;
}

}  // namespace kernelrl

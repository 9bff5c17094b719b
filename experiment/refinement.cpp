#include "experiment/refinement.hpp"

#include "core/log.hpp"
#include "core/paths.hpp"
#include "experiment/scores.hpp"

#include <fmt/format.h>

namespace kernelrl {

Actions Refinement::start(uint64_t, const std::vector<ScoredRollout>&, const std::vector<Store::StepRow>&) {
  if (args_.task_ids.empty()) return finish(fmt::format("{} mode needs tasks", name(args_.mode)));
  SamplePlan plan;
  plan.step = 0;
  plan.n = k();
  plan.turn = 1;
  for (auto& t : args_.task_ids) {
    const uint64_t gid = next_gid_++;
    groups_[gid] = Group{t, 1, {}, {}};
    plan.task_ids.push_back(t);
    plan.group_ids.push_back(gid);
  }
  log::get("supervisor")
      ->info("{}: {} tasks x {} episodes of {} turns", name(args_.mode), args_.task_ids.size(), k(), args_.turns);
  return {act::Sample{std::move(plan)}};
}

Actions Refinement::planned(uint64_t n) {
  totals_.planned = true;
  totals_.expected += n;
  return {};
}

Actions Refinement::sampled(const ScoredRollout& s) {
  totals_.count(s, mono_s());
  auto it = groups_.find(s.rollout.group_id);
  if (it == groups_.end()) {
    log::get("supervisor")->warn("sample {} belongs to no open group; it is kept in the store", s.rollout.sample_id);
    return {};
  }
  auto& g = it->second;
  g.samples.push_back(s);
  if (g.samples.size() < k()) return {};
  sort_by_sample_index(g.samples);
  if (g.turn >= args_.turns) {
    groups_.erase(it);
    ++tasks_done_;
    return !finished_ && tasks_done_ == args_.task_ids.size() ? finish("") : Actions{};
  }
  Group next{g.task_id, g.turn + 1, {}, std::move(g.earlier)};
  next.earlier.push_back(std::move(g.samples));
  groups_.erase(it);
  const uint64_t gid = next_gid_++;
  SamplePlan plan = next_turn_plan(0, next.task_id, gid, k(), next.earlier, args_.feedback_chars);
  groups_[gid] = std::move(next);
  return {act::Sample{std::move(plan)}};
}

nlohmann::json Refinement::summary(const std::string& error, const std::vector<Store::StepRow>& step_rows) {
  nlohmann::json j = Experiment::summary(error, step_rows);
  j["turns"] = args_.turns;
  j["tasks_done"] = tasks_done_;
  return j;
}

}  // namespace kernelrl

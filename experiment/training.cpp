#include "experiment/training.hpp"

#include "core/log.hpp"
#include "core/paths.hpp"
#include "learner/advantages.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

namespace kernelrl {

namespace {
void append(Actions& out, Actions more) {
  for (auto& a : more) out.push_back(std::move(a));
}
}  // namespace

Training::Training(ExperimentArgs args)
    : Experiment(std::move(args)), held_out_(args_.eval_task_ids, args_.eval_every, args_.eval_samples) {
  tracker_.patience = args_.patience;
  tracker_.regressions = args_.stop_on_regressions;
}

const std::string& Training::task_for(uint32_t step, uint32_t k) const {
  const uint64_t i = uint64_t(step) * args_.batch_size + k;
  return args_.task_ids[train_task_index(args_.seed, args_.task_ids.size(), i)];
}

Actions Training::start(uint64_t version, const std::vector<ScoredRollout>& earlier,
                        const std::vector<Store::StepRow>& earlier_steps) {
  totals_.planned = true;
  if (args_.task_ids.empty() || args_.steps == 0)
    return finish(fmt::format("{} mode needs tasks and steps", name(args_.mode)));
  version_ = first_version_ = version;
  t_synced_ = mono_s();
  next_plan_ = uint32_t(version);
  if (!earlier.empty() || !earlier_steps.empty()) resume(earlier, earlier_steps);
  Actions out;
  if (version >= args_.steps) {
    log::get("supervisor")->info("the checkpoint is at version {}: all {} steps are done", version, args_.steps);
    end_learning(out);
    return out;
  }
  append(out, held_out_.plan(uint32_t(version)));  // the starting point, before any update
  log::get("supervisor")
      ->info("{}: steps {}..{}, {} tasks x {} samples per step, policy version {}", name(args_.mode), version,
             args_.steps - 1, args_.batch_size, args_.group_size, version);
  plan_more(out);
  return out;
}

// Counts the stored samples of this run once. Groups of the resumed step drawn within the
// staleness bound are reused: complete ones learned from again, unfinished ones completed (their
// missing samples drawn when the step is planned). Samples the run can no longer use (of later
// steps, or stale) stay in the store but are counted nowhere (abandoned_on_resume in the summary).
void Training::resume(const std::vector<ScoredRollout>& earlier, const std::vector<Store::StepRow>& earlier_steps) {
  const uint32_t from = uint32_t(version_);
  std::map<uint64_t, std::vector<ScoredRollout>> by_group;
  for (auto& rec : earlier) {
    ++resumed_samples_;
    const auto& r = rec.rollout;
    if (r.split.empty()) {
      auto& t = steps_[r.step];
      t.next_j = std::max(t.next_j, r.group_id % group_stride + 1);
    }
    if (!r.split.empty()) {  // a held-out round's: its tasks with a complete group are not planned again
      totals_.count(rec, mono_s());
      held_out_.add(rec);
    } else if (r.step < from) {
      totals_.count(rec, mono_s());
    } else if (r.step == from && !multi_turn()) {
      by_group[r.group_id].push_back(rec);
    } else {
      ++abandoned_;
    }
  }
  for (auto& [gid, g] : by_group) {
    bool fresh = g.size() <= args_.group_size;
    for (auto& x : g) fresh = fresh && version_ <= x.rollout.policy_version + args_.max_staleness;
    if (!fresh) {
      abandoned_ += g.size();
      continue;
    }
    if (g.size() == args_.group_size)  // an unfinished group is counted when its step takes it up
      for (auto& x : g) totals_.count(x, mono_s());
    auto& pool = g.size() == args_.group_size ? reusable_ : unfinished_;
    pool[g.front().rollout.task_id].push_back(std::move(g));
  }
  totals_.expected = totals_.recorded;
  for (auto& row : earlier_steps)  // the scores so far, for Best-of-Adaptation and early stopping
    if (row.stats.step < from) tracker_.record(row.stats.step, row.stats.fast_1);
  log::get("supervisor")
      ->info("resuming at step {} (policy version {}): {} samples already recorded, {} not reused", from, version_,
             resumed_samples_, abandoned_);
}

// Plans every step the staleness bound allows: step s once version >= s - max_staleness.
void Training::plan_more(Actions& out) {
  while (!finished_ && next_plan_ < args_.steps && uint64_t(next_plan_) <= version_ + args_.max_staleness)
    plan_step(next_plan_++, out);
}

void Training::plan_step(uint32_t s, Actions& out) {
  auto& t = steps_[s];
  t.groups = uint64_t(args_.batch_size) * args_.turns;  // multi-turn: a group a turn
  SamplePlan plan;
  plan.step = s;
  plan.n = args_.group_size;
  plan.turn = multi_turn() ? 1 : 0;
  std::vector<std::vector<ScoredRollout>> reused;
  Actions completions;  // the rest of groups left unfinished by a restart
  for (uint32_t k = 0; k < args_.batch_size; ++k) {
    const std::string& task = task_for(s, k);
    auto r = reusable_.find(task);
    if (r != reusable_.end() && !r->second.empty()) {  // resumed: this group is already evaluated
      reused.push_back(std::move(r->second.back()));
      r->second.pop_back();
      continue;
    }
    auto u = unfinished_.find(task);
    if (u != unfinished_.end() && !u->second.empty()) {  // resumed: the rest of this group is drawn
      auto samples = std::move(u->second.back());
      u->second.pop_back();
      for (auto& x : samples) totals_.count(x, mono_s());
      SamplePlan rest;
      rest.step = s;
      rest.n = args_.group_size - uint32_t(samples.size());
      for (auto& x : samples) rest.first_index = std::max(rest.first_index, x.rollout.sample_index + 1);
      rest.task_ids = {task};
      rest.group_ids = {samples.front().rollout.group_id};
      groups_[rest.group_ids[0]] = Group{task, s, std::move(samples), false, 0, 0, 0, {}};
      completions.push_back(act::Sample{std::move(rest)});
      continue;
    }
    uint64_t gid = uint64_t(s) * group_stride + t.next_j++;
    groups_[gid] = Group{task, s, {}, false, 0, 0, plan.turn, {}};
    plan.task_ids.push_back(task);
    plan.group_ids.push_back(gid);
  }
  out.push_back(act::LearnStep{s, uint64_t(args_.batch_size) * learned_turns()});  // the groups it learns from
  if (!reused.empty())
    log::get("supervisor")->info("step {}: {} groups evaluated before the restart are reused", s, reused.size());
  for (auto& g : reused) accept_group(s, g, out);
  if (!completions.empty())
    log::get("supervisor")
        ->info("step {}: {} groups left unfinished by the restart are completed", s, completions.size());
  for (auto& c : completions) out.push_back(std::move(c));
  for (auto& [task, left] : unfinished_)  // groups no task of the step takes up: never learned from
    for (auto& g : left) abandoned_ += g.size();
  unfinished_.clear();
  if (!plan.task_ids.empty()) out.push_back(act::Sample{std::move(plan)});
}

// A complete group within the staleness bound: counted in its step and handed to the learner
// (each sample learning from learned[i] instead of its reward when given: a turn's return), or
// counted only (learn false: an earlier turn under [learner] learn_turns = "last").
void Training::accept_group(uint32_t s, std::vector<ScoredRollout>& samples, Actions& out,
                            const std::vector<double>* learned, bool learn) {
  auto& t = steps_[s];
  for (size_t i = 0; i < samples.size(); ++i) {
    auto& x = samples[i];
    add_to(t.tasks, x);
    ++t.status_counts[to_string(x.result.status)];
    t.version = std::max(t.version, x.rollout.policy_version);
    if (learned) x.reward = (*learned)[i];
    if (learn) out.push_back(act::Learn{std::move(x), i + 1 == samples.size()});
  }
  if (++t.accepted < t.groups) return;
  t.stats = stats_of(t.tasks, t.status_counts, s);
  t.stats.policy_version = t.version;
  t.written = true;
  last_step_fast_1_ = t.stats.fast_1;
  out.push_back(act::StepDone{t.stats});
  log::get("supervisor")
      ->info("step {}: {} samples, fast_1 {:.3f}, mean reward {:.3f} (policy version {})", s, t.stats.samples,
             t.stats.fast_1, t.stats.mean_reward, t.version);
}

// Multi-turn: the next turn of a task whose turn g.turn is in, each sample continuing its episode
// with the episode's attempts so far and the evaluator's feedback on each.
void Training::next_turn(uint64_t gid, Group& g, Actions& out) {
  sort_by_sample_index(g.samples);
  Group next{g.task_id, g.step, {}, false, 0, g.replans, g.turn + 1, std::move(g.earlier)};
  next.earlier.push_back(std::move(g.samples));
  groups_.erase(gid);
  const uint64_t ngid = uint64_t(next.step) * group_stride + steps_[next.step].next_j++;
  SamplePlan plan = next_turn_plan(next.step, next.task_id, ngid, args_.group_size, next.earlier, args_.feedback_chars);
  groups_[ngid] = std::move(next);
  out.push_back(act::Sample{std::move(plan)});
}

// Multi-turn: a task's T turn groups are all in; each turn's group goes to the learner with its
// samples' returns (episode j: sample j of every turn).
void Training::accept_episodes(uint32_t s, std::vector<std::vector<ScoredRollout>>& turns, Actions& out) {
  const size_t T = turns.size(), E = turns.empty() ? 0 : turns[0].size();
  std::vector<std::vector<double>> learned(T, std::vector<double>(E, 0.0));
  for (size_t e = 0; e < E; ++e) {
    std::vector<double> r;
    for (size_t t = 0; t < T; ++t) r.push_back(e < turns[t].size() ? turns[t][e].reward : 0.0);
    auto g = turn_returns(r, args_.turn_gamma, args_.turn_progress);
    for (size_t t = 0; t < T; ++t) learned[t][e] = g[t];
  }
  for (size_t t = 0; t < T; ++t) accept_group(s, turns[t], out, &learned[t], t + learned_turns() >= T);
}

// No more learning (the last step, or early stopping): the newest version is evaluated on the
// held-out tasks, then the run ends.
void Training::end_learning(Actions& out) {
  ending_ = true;
  append(out, held_out_.plan(uint32_t(version_)));
  if (held_out_.done())
    append(out, finish(""));
  else
    log::get("supervisor")->info("learning is done; waiting for the evaluation of policy version {}", version_);
}

Actions Training::planned(uint64_t n) {
  totals_.expected += n;
  return {};
}

Actions Training::updated(const StepUpdate& u) {
  if (finished_) return {};
  if (!u.error.empty()) return finish("learner, step " + std::to_string(u.step) + ": " + u.error);
  version_ = std::max(version_, u.policy_version);
  auto& t = steps_[u.step];
  Actions out;
  if (t.written) {  // the checkpoint that sampled the step is scored now that both are known
    auto dir = checkpoint_dir(std::filesystem::path(u.checkpoint).parent_path().string(), t.version);
    out.push_back(act::StepLearned{t.stats, u.stats, Checkpoint{u.step, t.version, dir, t.stats.fast_1}});
  }
  if (t.written && tracker_.record(u.step, t.stats.fast_1)) {
    stopped_early_ = true;
    if (tracker_.regressions)
      log::get("supervisor")
          ->info("step {}: fast_1 fell {} steps in a row (best: step {}, {:.3f}): stopping early", u.step,
                 tracker_.falling, tracker_.best_step, tracker_.best);
    else
      log::get("supervisor")
          ->info("step {}: no better fast_1 than step {} ({:.3f}) for {} steps: stopping early", u.step,
                 tracker_.best_step, tracker_.best, tracker_.patience);
    end_learning(out);
    return out;
  }
  if (u.step + 1 >= args_.steps) {
    end_learning(out);
    return out;
  }
  // The new version's held-out round is queued before the next step's samples, so the same weights draw it.
  if (held_out_.periodic(version_)) append(out, held_out_.plan(uint32_t(version_)));
  plan_more(out);
  return out;
}

Actions Training::sampled(const ScoredRollout& s) {
  totals_.count(s, mono_s());
  if (!s.rollout.split.empty()) {
    held_out_.add(s);
    held_out_.progress(s.rollout.step);
    return ending_ && held_out_.done() && !finished_ ? finish("") : Actions{};
  }
  return record(s);
}

// A sample of a step: into its group; a complete group is accepted, or rejected as stale and its
// task sampled again.
Actions Training::record(const ScoredRollout& s) {
  auto lg = log::get("supervisor");
  auto it = groups_.find(s.rollout.group_id);
  if (it == groups_.end()) {
    lg->warn("sample {} belongs to no open group; it is kept in the store but not learned from", s.rollout.sample_id);
    return {};
  }
  auto& g = it->second;
  if (version_ > s.rollout.policy_version + args_.max_staleness) {
    g.stale = true;
    g.stale_version = s.rollout.policy_version;
  }
  g.samples.push_back(s);
  if (g.samples.size() < args_.group_size) return {};
  const uint32_t step = g.step;
  Actions out;
  if (!g.stale && multi_turn() && g.turn < args_.turns) {
    next_turn(it->first, g, out);
    return out;
  }
  if (!g.stale && multi_turn()) {
    sort_by_sample_index(g.samples);
    auto turns = std::move(g.earlier);
    turns.push_back(std::move(g.samples));
    groups_.erase(it);
    accept_episodes(step, turns, out);
    return out;
  }
  if (!g.stale) {
    auto samples = std::move(g.samples);
    groups_.erase(it);
    accept_group(step, samples, out);
    return out;
  }
  for (auto& e : g.earlier) stale_rejected_ += e.size();
  stale_rejected_ += g.samples.size();
  lg->warn(
      "step {}: group {} of task {} rejected: sampled by policy version {} while the learner is at {} "
      "(max_staleness {}); {} samples stay in the store, the task is sampled again",
      step, it->first, g.task_id, g.stale_version, version_, args_.max_staleness, g.samples.size());
  if (g.replans >= 3)
    return finish(fmt::format(
        "task {} of step {} came back stale {} times: a sampler keeps serving policy version {} while the learner "
        "is at {}",
        g.task_id, step, g.replans + 1, g.stale_version, version_));
  uint64_t gid = uint64_t(step) * group_stride + steps_[step].next_j++;
  Group again{g.task_id, step, {}, false, 0, g.replans + 1, multi_turn() ? 1u : 0u, {}};
  groups_.erase(it);
  groups_[gid] = again;
  ++groups_replanned_;
  SamplePlan plan;
  plan.step = step;
  plan.n = args_.group_size;
  plan.turn = again.turn;
  plan.task_ids = {again.task_id};
  plan.group_ids = {gid};
  out.push_back(act::Sample{std::move(plan)});
  return out;
}

nlohmann::json Training::summary(const std::string& error, const std::vector<Store::StepRow>& step_rows) {
  nlohmann::json j = Experiment::summary(error, step_rows);
  const auto checkpoints = (std::filesystem::path(args_.run_dir) / "checkpoints").string();
  nlohmann::json steps = nlohmann::json::array();
  for (auto& row : step_rows) {
    auto x = step_stats_json(row.stats);
    if (!row.learner.empty()) x["learner"] = row.learner;
    steps.push_back(x);
  }
  j["steps"] = steps;
  j["policy_version"] = version_;
  j["stale_rejected"] = stale_rejected_;
  j["groups_replanned"] = groups_replanned_;
  j["resumed_samples"] = resumed_samples_;
  j["abandoned_on_resume"] = abandoned_;
  if (tracker_.any) {  // Best-of-Adaptation: the step whose samples scored best, and its weights
    auto it = steps_.find(tracker_.best_step);
    uint64_t v = it != steps_.end() ? it->second.version : tracker_.best_step;
    j["boa"] = {{"step", tracker_.best_step},
                {"fast_1", tracker_.best},
                {"policy_version", v},
                {"checkpoint", checkpoint_dir(checkpoints, v)}};
  }
  j["stopped_early"] = stopped_early_;
  held_out_.summarize(j, checkpoints);
  return j;
}

std::map<std::string, double> Training::telemetry() const {
  auto v = Experiment::telemetry();
  v["policy_version"] = double(std::max(totals_.policy_version, version_));
  v["steps_total"] = double(args_.steps);
  v["step_fast_1"] = last_step_fast_1_;
  v["stale_rejected"] = double(stale_rejected_);
  if (held_out_.any()) {
    v["eval_fast_1"] = held_out_.last_fast_1();
    v["eval_version"] = double(held_out_.last_version());
  }
  // The sample count grows as steps are planned: the ETA is the pace of the steps done so far.
  const double done = double(version_) - double(first_version_);
  v["eta_s"] = done > 0 && t_synced_ > 0 && !finished_
                   ? (mono_s() - t_synced_) / done * std::max(0.0, double(args_.steps) - double(version_))
                   : -1.0;
  return v;
}

}  // namespace kernelrl

#include "actors/supervisor.hpp"

#include "core/log.hpp"
#include "experiment/scores.hpp"
#include "core/paths.hpp"
#include "store/store.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

namespace kernelrl {

namespace {

struct supervisor_state {
  std::unique_ptr<Store> store;
  caf::response_promise done;
  bool planned = false, finished = false;
  uint64_t expected = 0, recorded = 0, duplicates = 0, store_failures = 0;
  std::map<std::string, uint64_t> status_counts;
  std::map<std::string, TaskAgg> tasks;
  size_t evaluators_alive = 0;
  uint64_t waits = 0;  // join deadlines started (a deadline only counts if it is the latest)
  double t_start = 0;
  double t_first_record = -1, t_last_record = -1;  // mono_s of the first and last stored sample
  std::vector<double> speedups;                    // of correct samples (the speedup distribution)
  std::vector<uint64_t> reward_hist;               // counts per reward_bin()
  uint32_t step = 0;                               // latest step a recorded sample belongs to
  uint64_t policy_version = 0;                     // newest policy version seen in a sample
  uint64_t stale_max = 0, stale_sum = 0;           // policy_version - sample's version, at record time
  // train mode
  struct GroupTrack {
    std::string task_id;
    uint32_t step = 0;
    std::vector<ScoredRollout> samples;
    bool stale = false;          // a sample was staler than allowed: the group is rejected
    uint64_t stale_version = 0;  // the stale sample's version
    uint32_t replans = 0;        // how often this task was sampled again in this step
  };
  struct StepTrack {
    uint64_t groups = 0, accepted = 0;  // planned, and complete and accepted
    uint64_t next_j = 0;                // next group number in this step
    std::map<std::string, TaskAgg> tasks;
    std::map<std::string, uint64_t> status_counts;
    uint64_t version = 0;  // newest version among its accepted samples
    bool written = false;
    StepStats stats;
  };
  caf::actor sampler;
  std::map<uint64_t, GroupTrack> groups;  // open groups by group id
  std::map<uint32_t, StepTrack> steps;
  std::map<std::string, std::vector<std::vector<ScoredRollout>>> reusable;  // resume: complete groups by task
  uint32_t next_plan = 0;                                                   // next step to plan
  uint64_t version = 0;                                                     // the learner's newest acknowledged version
  uint64_t stale_rejected = 0, groups_replanned = 0, abandoned = 0, resumed_samples = 0;
  double last_step_fast_1 = -1;
  AdaptationTracker tracker;  // Best-of-Adaptation and early stopping
  bool stopped_early = false;
  // train with eval tasks: one round per evaluated version
  struct EvalRound {
    uint64_t expected = 0, recorded = 0;                          // samples planned and stored
    uint64_t next_j = 0;                                          // next group number of this round
    std::map<uint64_t, std::pair<std::string, uint32_t>> groups;  // group id -> task, samples stored
    std::map<std::string, TaskAgg> tasks;
    std::map<std::string, uint64_t> status_counts;
    uint64_t min_version = ~uint64_t(0), max_version = 0;  // versions that actually sampled it
    bool reported = false;
  };
  std::map<uint32_t, EvalRound> evals;  // by the version evaluated
  bool ending = false;                  // learning is over; the run ends once the evaluations are in
  double last_eval_fast_1 = -1;
  uint32_t last_eval_version = 0;
  uint64_t eval_rollouts = 0;
  uint64_t first_version = 0;  // the version the run started (or resumed) from
  double t_synced = -1;        // mono_s when it started sampling
  // compute spent (compute.json)
  uint64_t student_tokens = 0;
  double eval_wall_s = 0, eval_device_s = 0, compile_s = 0;
  static inline const char* name = "supervisor";
};

using self_ptr = caf::stateful_actor<supervisor_state>*;

constexpr uint64_t group_stride = uint64_t(1) << 20;     // group ids of step s: s * stride + j
constexpr uint64_t eval_group_base = uint64_t(1) << 62;  // group ids of evaluation rounds: base + v * stride + j

// train and ttt: the modes in which a learner updates the policy step by step.
bool learns(const SupervisorArgs& a) { return traits(a.mode).learns; }

StepStats step_stats(const supervisor_state& st, uint32_t step) { return stats_of(st.tasks, st.status_counts, step); }

// Counts a recorded sample in the run's totals (its compute always; its scores only when it is a
// sample of the experiment, not of a periodic evaluation).
void count_sample(supervisor_state& st, const ScoredRollout& s) {
  ++st.recorded;
  st.t_last_record = mono_s();
  if (st.t_first_record < 0) st.t_first_record = st.t_last_record;
  st.student_tokens += s.rollout.token_ids.size();
  st.eval_wall_s += s.result.wall_s;
  st.compile_s += s.result.compile_s;
  if (s.result.device_start > 0 && s.result.device_end > s.result.device_start)
    st.eval_device_s += s.result.device_end - s.result.device_start;
  if (!s.rollout.split.empty()) {
    ++st.eval_rollouts;
    return;
  }
  ++st.status_counts[to_string(s.result.status)];
  if (st.reward_hist.empty()) st.reward_hist.assign(reward_histogram_bins().size(), 0);
  if (is_verdict(s.result.status)) ++st.reward_hist[reward_bin(s.reward)];
  st.step = std::max(st.step, s.rollout.step);
  st.policy_version = std::max(st.policy_version, s.rollout.policy_version);
  uint64_t stale = st.policy_version - s.rollout.policy_version;
  st.stale_max = std::max(st.stale_max, stale);
  st.stale_sum += stale;
  add_to(st.tasks, s);
  if (s.result.status == EvalStatus::ok) st.speedups.push_back(s.result.speedup);
}

// A periodic evaluation's sample into its round (the version it evaluates).
void add_eval(supervisor_state& st, const ScoredRollout& s) {
  auto& e = st.evals[s.rollout.step];
  ++e.recorded;
  add_to(e.tasks, s);
  ++e.status_counts[to_string(s.result.status)];
  e.min_version = std::min(e.min_version, s.rollout.policy_version);
  e.max_version = std::max(e.max_version, s.rollout.policy_version);
  auto& g = e.groups[s.rollout.group_id];
  g.first = s.rollout.task_id;
  ++g.second;
  e.next_j = std::max(e.next_j, s.rollout.group_id % group_stride + 1);
}

// One evaluation round as the summary reports it.
nlohmann::json eval_json(uint32_t version, const supervisor_state::EvalRound& e, const std::string& checkpoints) {
  StepStats s = stats_of(e.tasks, e.status_counts, version);
  nlohmann::json tasks = nlohmann::json::array();
  for (auto& [id, t] : e.tasks)
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
  if (e.recorded > 0) j["sampled_by_versions"] = {e.min_version, e.max_version};
  auto dir = checkpoint_dir(checkpoints, version);
  if (std::filesystem::exists(dir)) j["checkpoint"] = dir;
  return j;
}

// The compute a run spent, with the settings that make two runs' budgets comparable.
nlohmann::json compute_json(const supervisor_state& st, const SupervisorArgs& args,
                            const std::vector<Store::StepRow>& steps) {
  double learner_s = 0, teacher_tokens = 0;
  for (auto& row : steps) {
    auto it = row.learner.find("learner_s");
    if (it != row.learner.end()) learner_s += it->second;
    it = row.learner.find("teacher_tokens");
    if (it != row.learner.end()) teacher_tokens += it->second;
  }
  auto skipped = st.status_counts.find("skipped");
  const uint64_t evaluations = st.recorded - (skipped == st.status_counts.end() ? 0 : skipped->second);
  return {{"rollouts", st.recorded},
          {"evaluations", evaluations},
          {"eval_split_rollouts", st.eval_rollouts},
          {"student_tokens", st.student_tokens},
          {"teacher_tokens", uint64_t(teacher_tokens)},
          {"eval_seconds", st.eval_wall_s},
          {"eval_device_seconds", st.eval_device_s},
          {"compile_seconds", st.compile_s},
          {"learner_seconds", learner_s},
          {"settings", args.settings}};
}

void finish(self_ptr self, const SupervisorArgs& args, const std::string& error) {
  auto& st = self->state;
  if (st.finished) return;
  st.finished = true;
  auto lg = log::get("supervisor");
  StepStats s = step_stats(st, 0);
  nlohmann::json j;
  j["run_id"] = args.run_id;
  j["mode"] = name(args.mode);
  j["ok"] = error.empty();
  j["error"] = error;
  j["expected"] = st.expected;
  j["samples"] = s.samples;
  j["correct"] = s.correct;
  j["fast_1"] = s.fast_1;
  j["mean_speedup"] = s.mean_speedup;
  j["mean_reward"] = s.mean_reward;
  j["status_counts"] = s.status_counts;
  j["duplicates_dropped"] = st.duplicates;
  j["store_failures"] = st.store_failures;
  j["wall_s"] = mono_s() - st.t_start;
  // From the first sample stored to the last: the pipeline's pace once work flows.
  j["record_span_s"] = st.t_first_record < 0 ? 0.0 : st.t_last_record - st.t_first_record;
  nlohmann::json tasks = nlohmann::json::array();
  for (auto& id : args.task_ids) {
    auto it = st.tasks.find(id);
    TaskAgg t = it == st.tasks.end() ? TaskAgg{} : it->second;
    tasks.push_back({{"task_id", id},
                     {"samples", t.samples},
                     {"correct", t.correct},
                     {"fast_1", t.samples ? double(t.faster) / double(t.samples) : 0.0},
                     {"mean_speedup", t.correct ? t.speedup_sum / double(t.correct) : 0.0}});
  }
  for (auto& [id, t] : st.tasks) {  // samples of tasks outside the task set (failed lookups)
    bool known = false;
    for (auto& k : args.task_ids) known = known || k == id;
    if (!known)
      tasks.push_back(
          {{"task_id", id}, {"samples", t.samples}, {"correct", t.correct}, {"fast_1", 0.0}, {"mean_speedup", 0.0}});
  }
  j["tasks"] = tasks;
  const auto step_rows = st.store ? st.store->steps(args.run_id) : std::vector<Store::StepRow>{};
  j["compute"] = compute_json(st, args, step_rows);
  if (!args.store_path.empty()) {
    auto path = std::filesystem::path(args.store_path).parent_path() / "compute.json";
    std::ofstream(path) << j["compute"].dump(2) << "\n";
  }
  if (learns(args)) {
    const auto checkpoints = (std::filesystem::path(args.store_path).parent_path() / "checkpoints").string();
    nlohmann::json steps = nlohmann::json::array();
    for (auto& row : step_rows) {
      auto x = step_stats_json(row.stats);
      if (!row.learner.empty()) x["learner"] = row.learner;
      steps.push_back(x);
    }
    j["steps"] = steps;
    j["policy_version"] = st.version;
    j["stale_rejected"] = st.stale_rejected;
    j["groups_replanned"] = st.groups_replanned;
    j["resumed_samples"] = st.resumed_samples;
    j["abandoned_on_resume"] = st.abandoned;
    if (st.tracker.any) {  // Best-of-Adaptation: the step whose samples scored best, and its weights
      auto it = st.steps.find(st.tracker.best_step);
      uint64_t v = it != st.steps.end() ? it->second.version : st.tracker.best_step;
      j["boa"] = {{"step", st.tracker.best_step},
                  {"fast_1", st.tracker.best},
                  {"policy_version", v},
                  {"checkpoint", checkpoint_dir(checkpoints, v)}};
    }
    j["stopped_early"] = st.stopped_early;
    if (!args.eval_task_ids.empty()) {  // the held-out evaluations, and the best of them
      nlohmann::json rounds = nlohmann::json::array();
      size_t best = 0;
      for (auto& [v, e] : st.evals) {
        if (e.recorded == 0) continue;
        rounds.push_back(eval_json(v, e, checkpoints));
        if (rounds.back()["fast_1"].get<double>() > rounds[best]["fast_1"].get<double>()) best = rounds.size() - 1;
      }
      if (!rounds.empty()) {  // the earliest on a tie
        j["eval_best"] = {{"policy_version", rounds[best]["policy_version"]}, {"fast_1", rounds[best]["fast_1"]}};
        if (rounds[best].contains("checkpoint")) j["eval_best"]["checkpoint"] = rounds[best]["checkpoint"];
      }
      j["eval"] = rounds;
      j["eval_tasks"] = args.eval_task_ids;
    }
  }
  if (st.store) {
    if (!learns(args) && s.samples > 0 && !st.store->record_step(args.run_id, s))
      lg->error("store: cannot record step 0: {}", st.store->last_error());
    if (!st.store->finish_run(args.run_id, error.empty() ? "completed" : "failed", j.dump()))
      lg->error("store: cannot finish run: {}", st.store->last_error());
  }
  if (error.empty())
    lg->info("run {} complete: {} samples, {} correct", args.run_id, s.samples, s.correct);
  else
    lg->error("run {} failed: {}", args.run_id, error);
  if (st.done.pending()) st.done.deliver(j.dump());
}

void plan_step(self_ptr self, const SupervisorArgs& args, uint32_t s);

// Plans every step the staleness bound allows: step s once version >= s - max_staleness.
void plan_more(self_ptr self, const SupervisorArgs& args) {
  auto& st = self->state;
  while (!st.finished && st.next_plan < args.steps && uint64_t(st.next_plan) <= st.version + args.max_staleness)
    plan_step(self, args, st.next_plan++);
}

// Asks the sampler for `n` samples of each task as the given groups.
void request_samples(self_ptr self, const SupervisorArgs& args, SamplePlan plan) {
  auto lg = log::get("supervisor");
  uint32_t step = plan.step;
  self->request(self->state.sampler, caf::infinite, std::move(plan))
      .then([=](uint64_t n) { self->state.expected += n; },
            [=](caf::error& e) {
              finish(self, args,
                     "sampler failed to plan step " + std::to_string(step) + ": " + error_text(self->system(), e));
            });
}

bool evals_done(const supervisor_state& st) {
  for (auto& [v, e] : st.evals)
    if (e.recorded < e.expected) return false;
  return true;
}

// Reports evaluation round `v` once all its samples are in; ends a run that only waited for it.
void eval_progress(self_ptr self, const SupervisorArgs& args, uint32_t v) {
  auto& st = self->state;
  auto& e = st.evals[v];
  if (e.expected > 0 && e.recorded >= e.expected && !e.reported) {
    e.reported = true;
    StepStats s = stats_of(e.tasks, e.status_counts, v);
    st.last_eval_fast_1 = s.fast_1;
    st.last_eval_version = v;
    log::get("supervisor")
        ->info("eval of policy version {}: {} samples over {} held-out tasks, correct {:.3f}, fast_1 {:.3f}", v,
               s.samples, e.tasks.size(), s.samples ? double(s.correct) / double(s.samples) : 0.0, s.fast_1);
  }
  if (st.ending && evals_done(st)) finish(self, args, "");
}

// Plans the evaluation of policy version `v` on the eval tasks, once. A round begun before a
// restart plans only the tasks that have no complete group yet.
void plan_eval(self_ptr self, const SupervisorArgs& args, uint32_t v) {
  auto& st = self->state;
  if (args.eval_task_ids.empty() || st.finished) return;
  auto& e = st.evals[v];
  if (e.expected > 0) return;
  if (args.selector) self->send(args.selector, keep_atom::value, v);  // its checkpoint stays with its score
  std::set<std::string> done;
  for (auto& [gid, g] : e.groups)
    if (g.second >= args.eval_samples) done.insert(g.first);
  SamplePlan plan;
  plan.step = v;
  plan.n = args.eval_samples;
  plan.split = "eval";
  for (auto& t : args.eval_task_ids) {
    if (done.count(t)) continue;
    plan.task_ids.push_back(t);
    plan.group_ids.push_back(eval_group_base + uint64_t(v) * group_stride + e.next_j++);
  }
  e.expected = e.recorded + uint64_t(plan.task_ids.size()) * args.eval_samples;
  log::get("supervisor")
      ->info("eval of policy version {}: {} held-out tasks x {} samples", v, plan.task_ids.size(), args.eval_samples);
  if (!plan.task_ids.empty())
    request_samples(self, args, std::move(plan));
  else
    eval_progress(self, args, v);
}

// No more learning (the last step, or early stopping): the newest version is evaluated, then the run ends.
void end_learning(self_ptr self, const SupervisorArgs& args) {
  auto& st = self->state;
  st.ending = true;
  plan_eval(self, args, uint32_t(st.version));
  if (evals_done(st))
    finish(self, args, "");
  else
    log::get("supervisor")->info("learning is done; waiting for the evaluation of policy version {}", st.version);
}

void step_complete(self_ptr self, const SupervisorArgs& args, uint32_t s) {
  auto& st = self->state;
  auto& t = st.steps[s];
  t.stats = stats_of(t.tasks, t.status_counts, s);
  t.stats.policy_version = t.version;
  t.written = true;
  st.last_step_fast_1 = t.stats.fast_1;
  if (st.store && !st.store->record_step(args.run_id, t.stats))
    log::get("supervisor")->error("store: cannot record step {}: {}", s, st.store->last_error());
  if (args.selector) self->send(args.selector, record_atom::value, t.stats);
  log::get("supervisor")
      ->info("step {}: {} samples, fast_1 {:.3f}, mean reward {:.3f} (policy version {})", s, t.stats.samples,
             t.stats.fast_1, t.stats.mean_reward, t.version);
}

// A complete group within the staleness bound: counted in its step and handed to the learner.
void accept_group(self_ptr self, const SupervisorArgs& args, uint32_t s, std::vector<ScoredRollout>& samples) {
  auto& st = self->state;
  auto& t = st.steps[s];
  for (auto& x : samples) {
    add_to(t.tasks, x);
    ++t.status_counts[to_string(x.result.status)];
    t.version = std::max(t.version, x.rollout.policy_version);
    self->send(args.learner, train_atom::value, x);
  }
  if (++t.accepted == t.groups) step_complete(self, args, s);
}

void on_update(self_ptr self, const SupervisorArgs& args, StepUpdate& u) {
  auto& st = self->state;
  if (st.finished) return;
  if (!u.error.empty()) {
    finish(self, args, "learner, step " + std::to_string(u.step) + ": " + u.error);
    return;
  }
  st.version = std::max(st.version, u.policy_version);
  auto& t = st.steps[u.step];
  if (st.store) {
    if (t.written && !st.store->record_step(args.run_id, t.stats, u.stats))
      log::get("supervisor")->error("store: cannot record step {}: {}", u.step, st.store->last_error());
    // The checkpoint that sampled step u.step is scored now that both are known.
    if (t.written) {
      Checkpoint c{u.step, t.version,
                   checkpoint_dir(std::filesystem::path(u.checkpoint).parent_path().string(), t.version),
                   t.stats.fast_1};
      if (!st.store->record_checkpoint(args.run_id, c))
        log::get("supervisor")->error("store: cannot record checkpoint {}: {}", c.path, st.store->last_error());
    }
  }
  if (t.written && st.tracker.record(u.step, t.stats.fast_1)) {
    st.stopped_early = true;
    log::get("supervisor")
        ->info("step {}: no better fast_1 than step {} ({:.3f}) for {} steps: stopping early", u.step,
               st.tracker.best_step, st.tracker.best, st.tracker.patience);
    end_learning(self, args);
    return;
  }
  if (u.step + 1 >= args.steps) {
    end_learning(self, args);
    return;
  }
  // The new version's evaluation is queued before the next step's samples, so the same weights draw it.
  if (args.eval_every > 0 && st.version % args.eval_every == 0) plan_eval(self, args, uint32_t(st.version));
  plan_more(self, args);
}

void plan_step(self_ptr self, const SupervisorArgs& args, uint32_t s) {
  auto& st = self->state;
  auto& t = st.steps[s];
  t.groups = args.batch_size;
  SamplePlan plan;
  plan.step = s;
  plan.n = args.group_size;
  std::vector<std::vector<ScoredRollout>> reused;
  for (uint32_t k = 0; k < args.batch_size; ++k) {
    // ttt adapts on the same tasks every step; train walks a shuffled sequence of them.
    const std::string& task =
        traits(args.mode).adapts
            ? args.task_ids[k % args.task_ids.size()]
            : args.task_ids[train_task_index(args.seed, args.task_ids.size(), uint64_t(s) * args.batch_size + k)];
    auto r = st.reusable.find(task);
    if (r != st.reusable.end() && !r->second.empty()) {  // resume: this group is already evaluated
      reused.push_back(std::move(r->second.back()));
      r->second.pop_back();
      continue;
    }
    uint64_t gid = uint64_t(s) * group_stride + t.next_j++;
    st.groups[gid] = supervisor_state::GroupTrack{task, s, {}, false, 0, 0};
    plan.task_ids.push_back(task);
    plan.group_ids.push_back(gid);
  }
  self->request(args.learner, caf::infinite, plan_atom::value, s, uint64_t(args.batch_size))
      .then([=](StepUpdate& u) { on_update(self, args, u); },
            [=](caf::error& e) {
              finish(self, args, "learner failed at step " + std::to_string(s) + ": " + error_text(self->system(), e));
            });
  if (!reused.empty())
    log::get("supervisor")->info("step {}: {} groups evaluated before the restart are reused", s, reused.size());
  for (auto& g : reused) accept_group(self, args, s, g);
  if (!plan.task_ids.empty()) request_samples(self, args, std::move(plan));
}

// Resume: counts the store's samples of this run once; complete groups of step `from` become
// reusable, samples of unfinished groups stay in the store but are not learned from.
void load_resumed(self_ptr self, const SupervisorArgs& args, uint32_t from) {
  auto& st = self->state;
  if (!st.store) return;
  std::map<uint64_t, std::vector<ScoredRollout>> by_group;
  for (auto& row : st.store->samples(args.run_id)) {
    count_sample(st, row.record);
    ++st.resumed_samples;
    const auto& r = row.record.rollout;
    if (!r.split.empty()) {  // an evaluation round's: its tasks with a complete group are not planned again
      add_eval(st, row.record);
      continue;
    }
    if (r.step == from)
      by_group[r.group_id].push_back(row.record);
    else if (r.step > from)
      ++st.abandoned;
    auto& t = st.steps[r.step];
    t.next_j = std::max(t.next_j, r.group_id % group_stride + 1);
  }
  for (auto& [gid, g] : by_group) {
    bool fresh = true;
    for (auto& x : g) fresh = fresh && st.version <= x.rollout.policy_version + args.max_staleness;
    if (g.size() == args.group_size && fresh)
      st.reusable[g.front().rollout.task_id].push_back(std::move(g));
    else
      st.abandoned += g.size();
  }
  st.expected = st.recorded;
  for (auto& row : st.store->steps(args.run_id))  // the scores so far, for BoA and early stopping
    if (row.stats.step < from) st.tracker.record(row.stats.step, row.stats.fast_1);
  log::get("supervisor")
      ->info("resuming at step {} (policy version {}): {} samples already recorded, {} not reused", from, st.version,
             st.resumed_samples, st.abandoned);
}

// A recorded sample in train mode: into its group; a complete group is accepted or rejected.
void record_train(self_ptr self, const SupervisorArgs& args, ScoredRollout& s) {
  auto& st = self->state;
  auto lg = log::get("supervisor");
  auto it = st.groups.find(s.rollout.group_id);
  if (it == st.groups.end()) {
    lg->warn("sample {} belongs to no open group; it is kept in the store but not learned from", s.rollout.sample_id);
    return;
  }
  auto& g = it->second;
  if (st.version > s.rollout.policy_version + args.max_staleness) {
    g.stale = true;
    g.stale_version = s.rollout.policy_version;
  }
  g.samples.push_back(std::move(s));
  if (g.samples.size() < args.group_size) return;
  const uint32_t step = g.step;
  if (!g.stale) {
    auto samples = std::move(g.samples);
    st.groups.erase(it);
    accept_group(self, args, step, samples);
    return;
  }
  st.stale_rejected += g.samples.size();
  lg->warn(
      "step {}: group {} of task {} rejected: sampled by policy version {} while the learner is at {} "
      "(max_staleness {}); {} samples stay in the store, the task is sampled again",
      step, it->first, g.task_id, g.stale_version, st.version, args.max_staleness, g.samples.size());
  if (g.replans >= 3) {
    finish(self, args,
           fmt::format("task {} of step {} came back stale {} times: a sampler keeps serving policy "
                       "version {} while the learner is at {}",
                       g.task_id, step, g.replans + 1, g.stale_version, st.version));
    return;
  }
  auto& t = st.steps[step];
  uint64_t gid = uint64_t(step) * group_stride + t.next_j++;
  supervisor_state::GroupTrack again{g.task_id, step, {}, false, 0, g.replans + 1};
  st.groups.erase(it);
  st.groups[gid] = again;
  ++st.groups_replanned;
  SamplePlan plan;
  plan.step = step;
  plan.n = args.group_size;
  plan.task_ids = {again.task_id};
  plan.group_ids = {gid};
  request_samples(self, args, std::move(plan));
}

caf::behavior supervisor_actor(self_ptr self, SupervisorArgs args) {
  auto lg = log::get("supervisor");
  std::string err;
  self->state.store = Store::open(args.store_path, args.synchronous, err);
  if (!self->state.store) {
    lg->error("{}", err);
  } else if (!self->state.store->begin_run(args.run_id, name(args.mode), args.config_toml)) {
    lg->error("store: cannot begin run: {}", self->state.store->last_error());
  }
  // No evaluator running: a single node fails at once; a cluster waits join_wait_s for one to
  // join (a node restarting, a new machine) before it gives up.
  auto none_left = [=](const std::string& why) {
    auto& st = self->state;
    if (st.finished || (st.planned && st.recorded >= st.expected)) return;
    if (args.join_wait_s <= 0) {
      finish(self, args, why);
      return;
    }
    uint64_t n = ++st.waits;
    lg->warn("no evaluator is running; waiting up to {:g} s for one to join", args.join_wait_s);
    self->delayed_send(self, std::chrono::milliseconds(static_cast<int64_t>(args.join_wait_s * 1000)), tick_atom::value,
                       n);
  };
  self->set_down_handler([=](caf::down_msg&) {
    auto& st = self->state;
    if (st.evaluators_alive > 0) --st.evaluators_alive;
    if (st.evaluators_alive == 0)
      none_left("no evaluator is running (see the errors above); " + std::to_string(st.expected - st.recorded) +
                " samples have no verdict");
  });
  self->state.t_start = mono_s();
  self->state.tracker.patience = args.patience;
  return {
      [=](plan_atom, caf::actor sampler, std::vector<caf::actor> evaluators) -> caf::response_promise {
        auto& st = self->state;
        st.done = self->make_response_promise();
        st.evaluators_alive = evaluators.size();
        for (auto& e : evaluators) self->monitor(e);
        if (!st.store) {
          finish(self, args, "the run store could not be opened: " + err);
          return st.done;
        }
        if (st.evaluators_alive == 0) {
          none_left("no evaluator is running (see the errors above)");
          if (st.finished) return st.done;
        }
        if (learns(args)) {
          st.sampler = sampler;
          st.planned = true;
          if (!args.learner || args.task_ids.empty() || args.steps == 0) {
            finish(self, args, "train mode needs a learner, tasks and steps");
            return st.done;
          }
          // The learner publishes its weights (a resumed run: its checkpoint's) before any sampling.
          self->request(args.learner, caf::infinite, sync_atom::value, std::vector<caf::actor>{sampler})
              .then(
                  [=](uint64_t v) {
                    auto& st = self->state;
                    st.version = v;
                    st.first_version = v;
                    st.t_synced = mono_s();
                    st.next_plan = uint32_t(v);
                    if (args.resume) load_resumed(self, args, uint32_t(v));
                    if (v >= args.steps) {
                      lg->info("the checkpoint is at version {}: all {} steps are done", v, args.steps);
                      end_learning(self, args);
                      return;
                    }
                    plan_eval(self, args, uint32_t(v));  // the starting point, before any update
                    lg->info("train: steps {}..{}, {} tasks x {} samples per step, policy version {}", v,
                             args.steps - 1, args.batch_size, args.group_size, v);
                    plan_more(self, args);
                  },
                  [=](caf::error& e) {
                    finish(self, args, "learner could not publish its weights: " + error_text(self->system(), e));
                  });
          return st.done;
        }
        self->request(sampler, caf::infinite, plan_atom::value, uint32_t{0})
            .then(
                [=](uint64_t n) {
                  auto& st = self->state;
                  st.planned = true;
                  st.expected = n;
                  lg->info("eval: {} samples to evaluate", n);
                  if (st.recorded >= st.expected) finish(self, args, "");
                },
                [=](caf::error& e) { finish(self, args, "sampler failed: " + self->system().render(e)); });
        return st.done;
      },
      [=](register_atom, caf::actor ev, const std::string& id) {  // from the gate: a remote evaluator
        self->monitor(ev);
        ++self->state.evaluators_alive;
        lg->info("evaluator {} joined ({} running)", id, self->state.evaluators_alive);
      },
      [=](tick_atom, uint64_t n) {  // a join deadline
        auto& st = self->state;
        if (n == st.waits && st.evaluators_alive == 0 && !st.finished)
          finish(self, args,
                 "no evaluator joined within " + fmt::format("{:g}", args.join_wait_s) + " s; " +
                     std::to_string(st.expected - st.recorded) + " samples have no verdict");
      },
      [=](record_atom, ScoredRollout& s) {
        auto& st = self->state;
        switch (st.store->record_sample(args.run_id, s)) {
          case InsertResult::duplicate:
            ++st.duplicates;
            lg->warn("sample {} arrived twice; the second copy is dropped", s.rollout.sample_id);
            return;
          case InsertResult::failed:
            ++st.store_failures;
            lg->error("store: cannot record sample {}: {}", s.rollout.sample_id, st.store->last_error());
            break;
          case InsertResult::inserted:
            break;
        }
        count_sample(st, s);
        if (learns(args)) {
          if (!s.rollout.split.empty()) {
            add_eval(st, s);
            eval_progress(self, args, s.rollout.step);
            return;
          }
          record_train(self, args, s);
          return;
        }
        if (st.planned && st.recorded >= st.expected) finish(self, args, "");
      },
      [=](record_atom, Telemetry& t) {
        auto& st = self->state;
        if (st.store && !st.store->record_telemetry(args.run_id, t))
          lg->warn("store: cannot record telemetry: {}", st.store->last_error());
      },
      [=](stats_atom) {
        auto& st = self->state;
        Telemetry t;
        t.ts = now_s();
        t.source = "supervisor";
        StepStats s = step_stats(st, 0);
        double elapsed = mono_s() - st.t_start;
        double rate = elapsed > 0 ? double(st.recorded) / elapsed : 0.0;
        double left = st.expected > st.recorded ? double(st.expected - st.recorded) : 0.0;
        t.values = {{"samples_done", double(st.recorded)},
                    {"samples_total", double(st.expected)},
                    {"correct", double(s.correct)},
                    {"fast_1", s.fast_1},
                    {"mean_reward", s.mean_reward},
                    {"mean_speedup", s.mean_speedup},
                    {"samples_per_s", rate},
                    {"eta_s", rate > 0 ? left / rate : -1.0},
                    {"elapsed_s", elapsed},
                    {"evaluators_alive", double(st.evaluators_alive)},
                    {"step", double(st.step)},
                    {"policy_version", double(std::max(st.policy_version, st.version))},
                    {"staleness_max", double(st.stale_max)},
                    {"staleness_mean", st.recorded ? double(st.stale_sum) / double(st.recorded) : 0.0},
                    {"correct_rate", st.recorded ? double(s.correct) / double(st.recorded) : 0.0}};
        t.step = st.step;
        if (learns(args)) {
          t.values["steps_total"] = double(args.steps);
          t.values["step_fast_1"] = st.last_step_fast_1;
          t.values["stale_rejected"] = double(st.stale_rejected);
          if (!args.eval_task_ids.empty()) {
            t.values["eval_fast_1"] = st.last_eval_fast_1;
            t.values["eval_version"] = double(st.last_eval_version);
          }
          // The sample count grows as steps are planned: the ETA is the pace of the steps done so far.
          const double done = double(st.version) - double(st.first_version);
          t.values["eta_s"] =
              done > 0 && st.t_synced > 0 && !st.finished
                  ? (mono_s() - st.t_synced) / done * std::max(0.0, double(args.steps) - double(st.version))
                  : -1.0;
        }
        for (auto& [k, v] : st.status_counts) t.values["status." + k] = double(v);
        auto xs = st.speedups;
        for (auto [name, q] : std::initializer_list<std::pair<const char*, double>>{
                 {"p10", 0.1}, {"p25", 0.25}, {"p50", 0.5}, {"p75", 0.75}, {"p90", 0.9}, {"max", 1.0}})
          t.values[std::string("speedup.") + name] = quantile(xs, q);
        for (size_t i = 0; i < reward_histogram_bins().size(); ++i)
          t.values["reward_hist." + reward_histogram_bins()[i]] =
              st.reward_hist.empty() ? 0.0 : double(st.reward_hist[i]);
        return t;
      },
  };
}

}  // namespace

caf::actor spawn_supervisor(caf::actor_system& sys, SupervisorArgs args) {
  return sys.spawn(supervisor_actor, std::move(args));
}

}  // namespace kernelrl

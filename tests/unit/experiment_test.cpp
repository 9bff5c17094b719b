// experiment/: the modes' plain logic, tested without actors or processes.
#include "experiment/adaptation.hpp"
#include "experiment/experiment.hpp"
#include "experiment/scores.hpp"
#include "experiment/training.hpp"

#include "tests/unit/actions.hpp"

#include <catch2/catch.hpp>

#include <set>
#include <vector>

using namespace kernelrl;

TEST_CASE("Best-of-Adaptation picks the best step, the earliest on a tie; patience stops the run", "[experiment]") {
  AdaptationTracker t;
  t.patience = 2;
  const std::vector<double> scores = {0.1, 0.3, 0.2, 0.3, 0.25, 0.5};
  std::vector<bool> stop;
  for (uint32_t s = 0; s < scores.size(); ++s) stop.push_back(t.record(s, scores[s]));
  // 0.3 at step 1; step 2 and step 3 (a tie) do not beat it: stop after step 3.
  CHECK(stop == std::vector<bool>{false, false, false, true, true, false});
  AdaptationTracker u;  // patience 0: never stops, keeps the best
  for (uint32_t s = 0; s < scores.size(); ++s) CHECK_FALSE(u.record(s, scores[s]));
  CHECK(u.best_step == 5);
  CHECK(u.best == 0.5);
  AdaptationTracker v;
  v.patience = 2;
  for (uint32_t s = 0; s < 4; ++s) v.record(s, scores[s]);
  CHECK(v.best_step == 1);  // the earlier of two 0.3s
}

TEST_CASE("early stopping on consecutive regressions: P steps in a row each below the step before", "[experiment]") {
  AdaptationTracker t;
  t.patience = 2;
  t.regressions = true;
  // falls in a row: 0.3 (1), 0.35 rises (0), 0.2 (1), 0.2 (a tie is no regression: 0), 0.1 (1), 0.05 (2)
  const std::vector<double> scores = {0.4, 0.3, 0.35, 0.2, 0.2, 0.1, 0.05};
  std::vector<bool> stop;
  for (uint32_t s = 0; s < scores.size(); ++s) stop.push_back(t.record(s, scores[s]));
  CHECK(stop == std::vector<bool>{false, false, false, false, false, false, true});
  CHECK(t.best_step == 0);  // Best-of-Adaptation is the same under either rule
  AdaptationTracker u;      // the default rule stops at step 2 (two steps without a new best)
  u.patience = 2;
  std::vector<bool> stop_u;
  for (uint32_t s = 0; s < scores.size(); ++s) stop_u.push_back(u.record(s, scores[s]));
  CHECK(stop_u == std::vector<bool>{false, false, true, true, true, true, true});
}

TEST_CASE("the train sequence visits every task once per epoch, in a seeded order", "[experiment]") {
  for (uint64_t epoch = 0; epoch < 4; ++epoch) {
    std::set<size_t> seen;
    for (uint64_t i = 0; i < 5; ++i) seen.insert(train_task_index(7, 5, epoch * 5 + i));
    CHECK(seen == std::set<size_t>{0, 1, 2, 3, 4});
  }
  std::vector<size_t> a, b, c;
  for (uint64_t i = 0; i < 20; ++i) {
    a.push_back(train_task_index(7, 5, i));
    b.push_back(train_task_index(7, 5, i));
    c.push_back(train_task_index(8, 5, i));
  }
  CHECK(a == b);  // a resumed run walks the same sequence
  CHECK(a != c);  // another seed, another order
}

namespace {
ScoredRollout sample(const std::string& task, EvalStatus status, double speedup, double reward) {
  ScoredRollout s;
  s.rollout.task_id = task;
  s.result.status = status;
  s.result.speedup = speedup;
  s.reward = reward;
  return s;
}
}  // namespace

TEST_CASE("a step's statistics: fast_1 over every sample with a verdict, speedup over correct ones", "[experiment]") {
  std::map<std::string, TaskAgg> tasks;
  add_to(tasks, sample("a", EvalStatus::ok, 2.0, 2.0));
  add_to(tasks, sample("a", EvalStatus::ok, 0.5, 0.5));
  add_to(tasks, sample("a", EvalStatus::incorrect, 0.0, 0.0));
  add_to(tasks, sample("b", EvalStatus::ok, 1.5, 1.5));
  add_to(tasks, sample("b", EvalStatus::skipped, 0.0, 0.0));  // no verdict: in no rate
  StepStats s = stats_of(tasks, {{"ok", 3}, {"incorrect", 1}}, 4);
  CHECK(s.step == 4);
  CHECK(s.samples == 4);
  CHECK(s.correct == 3);
  CHECK(s.fast_1 == 0.5);  // 2.0 and 1.5 of 4
  CHECK(s.mean_speedup == (2.0 + 0.5 + 1.5) / 3);
  CHECK(s.mean_reward == (2.0 + 0.5 + 0.0 + 1.5) / 4);
  CHECK(tasks["a"].faster == 1);
  CHECK(stats_of({}, {}, 0).fast_1 == 0.0);
}

TEST_CASE("reward bins close on the right and quantiles take the nearest rank", "[experiment]") {
  REQUIRE(reward_histogram_bins().size() == 7);
  CHECK(reward_bin(-1) == 0);
  CHECK(reward_bin(0) == 0);
  CHECK(reward_bin(0.25) == 1);
  CHECK(reward_bin(0.5) == 1);
  CHECK(reward_bin(1.0) == 2);
  CHECK(reward_bin(5.0) == 5);
  CHECK(reward_bin(860.0) == 6);
  std::vector<double> xs = {5, 1, 4, 2, 3};
  CHECK(quantile(xs, 0.0) == 1);
  CHECK(quantile(xs, 0.5) == 3);
  CHECK(quantile(xs, 1.0) == 5);
  std::vector<double> none;
  CHECK(quantile(none, 0.5) == 0);
}

// The experiments of the modes, driven as the supervisor drives them: a fake sampler answers each
// act::Sample with its samples (every one correct, `speedup` faster), a fake learner each LearnStep.
namespace {

using test::of;

bool finishes(const Actions& xs, const std::string& error = "") {
  auto f = of<act::Finish>(xs);
  return f.size() == 1 && f[0].error == error;
}

// The samples of a plan, drawn by `version`.
std::vector<ScoredRollout> draw(const SamplePlan& p, uint64_t version, double speedup) {
  std::vector<ScoredRollout> out;
  for (size_t k = 0; k < p.task_ids.size(); ++k)
    for (uint32_t i = 0; i < p.n; ++i) {
      ScoredRollout s = sample(p.task_ids[k], EvalStatus::ok, speedup, speedup);
      s.rollout.group_id = p.group_ids[k];
      s.rollout.sample_index = i;
      s.rollout.sample_id = p.task_ids[k] + "#" + std::to_string(p.group_ids[k]) + "." + std::to_string(i);
      s.rollout.step = p.step;
      s.rollout.policy_version = version;
      s.rollout.split = p.split;
      out.push_back(s);
    }
  return out;
}

// Feeds every sample of every act::Sample in `xs` to `e` (after its planned()); returns what it answered.
Actions sample_all(Experiment& e, const Actions& xs, uint64_t version, double speedup) {
  Actions out;
  for (auto& a : of<act::Sample>(xs)) {
    for (auto& x : e.planned(uint64_t(a.plan.task_ids.size()) * a.plan.n)) out.push_back(x);
    for (auto& s : draw(a.plan, version, speedup))
      for (auto& x : e.sampled(s)) out.push_back(x);
  }
  return out;
}

StepUpdate update(uint32_t step, uint64_t version) {
  StepUpdate u;
  u.step = step;
  u.policy_version = version;
  u.checkpoint = "/runs/r/checkpoints/step-" + std::to_string(version);
  u.stats = {{"loss", 0.5}};
  return u;
}

ExperimentArgs learning(Mode mode) {
  ExperimentArgs a;
  a.run_id = "r";
  a.run_dir = "/runs/r";
  a.mode = mode;
  a.task_ids = {"t1", "t2", "t3"};
  a.steps = 2;
  a.batch_size = 2;
  a.group_size = 2;
  return a;
}

}  // namespace

TEST_CASE("eval and best_of_n: the sampler plans every task; the run ends with the last verdict", "[experiment]") {
  ExperimentArgs a;
  a.mode = Mode::best_of_n;
  a.task_ids = {"t1", "t2"};
  auto e = make_experiment(a);
  auto first = e->start(0, {}, {});
  REQUIRE(first.size() == 1);
  CHECK(std::holds_alternative<act::SampleAll>(first[0]));
  ScoredRollout early = sample("t1", EvalStatus::ok, 2.0, 2.0);
  CHECK(e->sampled(early).empty());  // a verdict before the plan's answer ends nothing
  CHECK(e->planned(3).empty());
  CHECK(e->outstanding() == 2);
  CHECK(e->sampled(sample("t2", EvalStatus::incorrect, 0, 0)).empty());
  CHECK(finishes(e->sampled(sample("t2", EvalStatus::ok, 0.5, 0.5))));
  auto row = e->final_row();
  REQUIRE(row);
  CHECK(row->samples == 3);
  CHECK(row->correct == 2);
  auto j = e->summary("", {});
  CHECK(j["mode"] == "best_of_n");
  CHECK(j["samples"] == 3);
  CHECK(j["tasks"].size() == 2);
  CHECK(j["compute"]["rollouts"] == 3);
  CHECK_FALSE(j.contains("steps"));
}

TEST_CASE("train: each step's groups go to the learner once complete; the next step waits for the update",
          "[experiment]") {
  auto e = make_experiment(learning(Mode::train));
  auto first = e->start(0, {}, {});
  auto steps = of<act::LearnStep>(first);
  REQUIRE(steps.size() == 1);  // max_staleness 0: only step 0 until its update
  CHECK(steps[0].step == 0);
  CHECK(steps[0].groups == 2);
  auto plans = of<act::Sample>(first);
  REQUIRE(plans.size() == 1);
  CHECK(plans[0].plan.task_ids.size() == 2);
  CHECK(plans[0].plan.n == 2);
  auto got = sample_all(*e, first, 0, 2.0);
  auto to_learn = of<act::Learn>(got);
  REQUIRE(to_learn.size() == 4);
  for (size_t i = 0; i < to_learn.size(); ++i) {  // a group's samples together, its last one saying so
    const bool ends =
        i + 1 == to_learn.size() || to_learn[i + 1].sample.rollout.group_id != to_learn[i].sample.rollout.group_id;
    CHECK(to_learn[i].last == ends);
  }
  CHECK(std::count_if(to_learn.begin(), to_learn.end(), [](const act::Learn& l) { return l.last; }) == 2);
  auto done = of<act::StepDone>(got);
  REQUIRE(done.size() == 1);
  CHECK(done[0].stats.samples == 4);
  CHECK(done[0].stats.fast_1 == 1.0);
  auto next = e->updated(update(0, 1));
  auto learned = of<act::StepLearned>(next);
  REQUIRE(learned.size() == 1);
  CHECK(learned[0].checkpoint.path == "/runs/r/checkpoints/step-0");  // the weights that sampled step 0
  CHECK(learned[0].learner.at("loss") == 0.5);
  REQUIRE(of<act::LearnStep>(next).size() == 1);
  CHECK(of<act::LearnStep>(next)[0].step == 1);
  sample_all(*e, next, 1, 1.5);
  CHECK(finishes(e->updated(update(1, 2))));
  auto j = e->summary("", {});
  CHECK(j["policy_version"] == 2);
  CHECK(j["boa"]["step"] == 0);  // fast_1 1.0 at both steps: the earlier
  CHECK(j["boa"]["checkpoint"] == "/runs/r/checkpoints/step-0");
  CHECK(j["stopped_early"] == false);
  CHECK(j["samples"] == 8);
}

TEST_CASE("train: a group staler than max_staleness is rejected and its task sampled again", "[experiment]") {
  auto e = make_experiment(learning(Mode::train));
  auto first = e->start(0, {}, {});
  auto plan = of<act::Sample>(first).at(0).plan;
  auto samples = draw(plan, 0, 2.0);
  // The learner moved on (a late answer of another step) before step 0's samples arrived.
  e->updated(update(5, 3));
  Actions got;
  for (auto& s : samples)
    for (auto& x : e->sampled(s)) got.push_back(x);
  CHECK(of<act::Learn>(got).empty());
  auto again = of<act::Sample>(got);
  REQUIRE(again.size() == 2);  // both groups, each its task again under a new group id
  CHECK(again[0].plan.task_ids == std::vector<std::string>{plan.task_ids[0]});
  CHECK(again[0].plan.group_ids[0] != plan.group_ids[0]);
  CHECK(e->summary("", {})["stale_rejected"] == 4);
  CHECK(e->summary("", {})["groups_replanned"] == 2);
}

TEST_CASE("train with held-out tasks: rounds at the first, every eval_every-th and the last version", "[experiment]") {
  auto a = learning(Mode::train);
  a.steps = 3;
  a.eval_task_ids = {"h1"};
  a.eval_every = 2;
  a.eval_samples = 3;
  auto e = make_experiment(a);
  auto first = e->start(0, {}, {});
  auto keeps = of<act::Keep>(first);
  REQUIRE(keeps.size() == 1);
  CHECK(keeps[0].version == 0);
  auto plans = of<act::Sample>(first);
  REQUIRE(plans.size() == 2);  // the round of version 0 before step 0's samples
  CHECK(plans[0].plan.split == "eval");
  CHECK(plans[0].plan.n == 3);
  CHECK(plans[1].plan.split == "");
  auto got = sample_all(*e, first, 0, 2.0);
  CHECK(of<act::Learn>(got).size() == 4);  // held-out samples are never learned from
  std::vector<uint64_t> rounds;
  Actions next = e->updated(update(0, 1));
  for (uint32_t s = 1; !finishes(next); ++s) {
    for (auto& k : of<act::Keep>(next)) rounds.push_back(k.version);
    auto more = sample_all(*e, next, s, 2.0);
    if (finishes(more)) break;
    next = e->updated(update(s, s + 1));
    if (s + 1 == a.steps) {  // the last version: its round, then the end once it is in
      for (auto& k : of<act::Keep>(next)) rounds.push_back(k.version);
      CHECK(of<act::Finish>(next).empty());
      CHECK(finishes(sample_all(*e, next, s + 1, 2.0)));
      break;
    }
  }
  CHECK(rounds == std::vector<uint64_t>{2, 3});
  auto j = e->summary("", {});
  REQUIRE(j["eval"].size() == 3);
  CHECK(j["eval"][0]["samples"] == 3);
  CHECK(j["eval_tasks"] == std::vector<std::string>{"h1"});
  CHECK(j["compute"]["eval_split_rollouts"] == 9);
}

TEST_CASE("a resumed train run reuses complete groups, completes unfinished ones and counts no sample it cannot use",
          "[experiment]") {
  // Step 0 (version 0) and one complete group of step 1 (version 1) were stored before the restart;
  // a group of step 1 has one sample only.
  std::vector<ScoredRollout> earlier;
  auto first_run = make_experiment(learning(Mode::train));
  auto p0 = of<act::Sample>(first_run->start(0, {}, {})).at(0).plan;
  for (auto& s : draw(p0, 0, 2.0)) earlier.push_back(s);
  SamplePlan p1;
  p1.step = 1;
  p1.n = 2;
  p1.task_ids = {train_task_index(0, 3, 2) == 0 ? "t1" : train_task_index(0, 3, 2) == 1 ? "t2" : "t3"};
  p1.group_ids = {Training::group_stride + 0};
  for (auto& s : draw(p1, 1, 2.0)) earlier.push_back(s);
  // The other task of step 1 has one sample of its group stored; a group of step 2 (a version
  // that is not the checkpoint's) has one too.
  const size_t other = train_task_index(0, 3, 3);
  auto partial = draw(p1, 1, 2.0);
  partial[0].rollout.group_id = Training::group_stride + 1;
  partial[0].rollout.task_id = other == 0 ? "t1" : other == 1 ? "t2" : "t3";
  earlier.push_back(partial[0]);
  auto later = partial[1];
  later.rollout.step = 2;
  later.rollout.group_id = 2 * Training::group_stride;
  earlier.push_back(later);
  std::vector<Store::StepRow> rows(1);
  rows[0].stats.step = 0;
  rows[0].stats.fast_1 = 1.0;

  auto e = make_experiment(learning(Mode::train));
  auto first = e->start(1, earlier, rows);
  CHECK(of<act::Learn>(first).size() == 2);  // the complete group of step 1, learned again
  auto plans = of<act::Sample>(first);
  REQUIRE(plans.size() == 1);  // only the rest of the unfinished group: one sample, after the stored one
  CHECK(plans[0].plan.task_ids == std::vector<std::string>{partial[0].rollout.task_id});
  CHECK(plans[0].plan.group_ids[0] == Training::group_stride + 1);
  CHECK(plans[0].plan.n == 1);
  CHECK(plans[0].plan.first_index == 1);
  auto j = e->summary("", {});
  CHECK(j["resumed_samples"] == 8);
  CHECK(j["abandoned_on_resume"] == 1);  // step 2's: counted nowhere, not in compute.json either
  CHECK(j["samples"] == 7);
  CHECK(j["compute"]["rollouts"] == 7);
  auto rest = sample_all(*e, first, 1, 2.0);  // the group completes and goes to the learner
  CHECK(of<act::Learn>(rest).size() == 2);
  CHECK(of<act::StepDone>(rest).size() == 1);
}

TEST_CASE("ttt adapts on every task each step and stops early without improvement", "[experiment]") {
  auto a = learning(Mode::ttt);
  a.steps = 10;
  a.batch_size = 1;  // ignored: every task, every step
  a.patience = 2;
  auto e = make_experiment(a);
  Actions next = e->start(0, {}, {});
  uint32_t s = 0;
  for (; s < 10; ++s) {
    auto plans = of<act::Sample>(next);
    REQUIRE(plans.size() == 1);
    CHECK(plans[0].plan.task_ids == a.task_ids);
    sample_all(*e, next, s, s == 0 ? 2.0 : 0.5);  // step 0 is the best
    next = e->updated(update(s, s + 1));
    if (finishes(next)) break;
  }
  CHECK(s == 2);  // steps 1 and 2 did not beat step 0
  auto j = e->summary("", {});
  CHECK(j["stopped_early"] == true);
  CHECK(j["boa"]["step"] == 0);
}

TEST_CASE("a learner error ends a learning run with the step that failed", "[experiment]") {
  auto e = make_experiment(learning(Mode::sdpo));
  auto first = e->start(0, {}, {});
  sample_all(*e, first, 0, 2.0);
  StepUpdate u = update(0, 0);
  u.error = "CUDA out of memory";
  CHECK(finishes(e->updated(u), "learner, step 0: CUDA out of memory"));
  CHECK(e->updated(update(0, 1)).empty());  // nothing after the end
}

// experiment/: the modes' plain logic, tested without actors or processes.
#include "experiment/adaptation.hpp"
#include "experiment/scores.hpp"

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

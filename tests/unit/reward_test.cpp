// The reward is a pure function of the verdict and the [reward] config.
#include "experiment/reward.hpp"

#include <catch2/catch.hpp>

#include <cmath>

using namespace kernelrl;

namespace {
EvalResult verdict(EvalStatus s, double speedup = 0) {
  EvalResult r;
  r.status = s;
  r.speedup = speedup;
  return r;
}
}  // namespace

TEST_CASE("correct samples earn their clipped speedup plus the bonus", "[reward]") {
  RewardConfig c;
  c.max_speedup = 10;
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 2.5)) == 2.5);
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 0.5)) == 0.5);
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 47.0)) == 10.0);
  c.correct_bonus = 0.25;
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 2.0)) == 2.25);
  c.shape = "log_speedup";
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 2.0)) == Approx(std::log(2.0) + 0.25));
}

TEST_CASE("by default the reward is the raw speedup, gated by correctness, as the seeds reward it", "[reward]") {
  RewardConfig c;  // no cap
  CHECK(c.max_speedup == 0);
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 860.0)) == 860.0);
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 0.4)) == 0.4);
  CHECK(compute_reward(c, verdict(EvalStatus::incorrect, 860.0)) == 0.0);
  CHECK(compute_reward(c, verdict(EvalStatus::compile_error, 860.0)) == 0.0);
  c.max_speedup = 10;  // the cap, as an option
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 860.0)) == 10.0);
}

TEST_CASE("the threshold shape is the sparse fast_p reward: 1 above the threshold, else 0", "[reward]") {
  RewardConfig c;
  c.shape = "threshold";
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 1.01)) == 1.0);
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 1.0)) == 0.0);  // as fast as the reference: not faster
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 0.3)) == 0.0);
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 47.0)) == 1.0);
  CHECK(compute_reward(c, verdict(EvalStatus::incorrect, 3.0)) == 0.0);
  c.threshold = 1.2;
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 1.1)) == 0.0);
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 1.3)) == 1.0);
}

TEST_CASE("failures earn the configured constants, by kind", "[reward]") {
  RewardConfig c;
  c.incorrect_reward = -0.1;
  c.failure_reward = -0.5;
  c.hacked_reward = -2;
  CHECK(compute_reward(c, verdict(EvalStatus::incorrect, 3.0)) == -0.1);
  CHECK(compute_reward(c, verdict(EvalStatus::hacked, 3.0)) == -2);
  for (auto s : {EvalStatus::format_error, EvalStatus::compile_error, EvalStatus::runtime_error, EvalStatus::timeout})
    CHECK(compute_reward(c, verdict(s, 3.0)) == -0.5);
}

TEST_CASE("an evaluation too large for its device is no verdict: 0, not the failure reward", "[reward]") {
  RewardConfig c;
  c.failure_reward = -0.5;
  CHECK(compute_reward(c, verdict(EvalStatus::out_of_memory)) == 0.0);
  CHECK(compute_reward(c, verdict(EvalStatus::runtime_error)) == -0.5);
  CHECK_FALSE(is_verdict(EvalStatus::out_of_memory));
  CHECK_FALSE(is_verdict(EvalStatus::skipped));
  CHECK(is_verdict(EvalStatus::runtime_error));
  CHECK(is_verdict(EvalStatus::ok));
}

TEST_CASE("hacked samples earn 0 by default, whatever speedup they claimed", "[reward]") {
  RewardConfig c;
  CHECK(compute_reward(c, verdict(EvalStatus::hacked, 50.0)) == 0.0);
}

TEST_CASE("per-task normalization divides the speedup by the task's running mean", "[reward]") {
  RewardConfig c;
  c.normalize = "task_mean";
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 3.0), 2.0) == 1.5);
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 3.0), 0.0) == 3.0);  // no mean yet
  c.normalize = "none";
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 3.0), 2.0) == 3.0);
}

TEST_CASE("the coverage term adds weight x coverage; low coverage is rejected as lazy", "[reward]") {
  RewardConfig c;
  c.coverage_weight = 0.5;
  auto r = verdict(EvalStatus::ok, 2.0);
  r.kernel_coverage = 0.8;
  CHECK(compute_reward(c, r) == Approx(2.4));
  r.kernel_coverage = -1;  // not measured (CPU): no term, no rejection
  CHECK(compute_reward(c, r) == 2.0);
  c.min_coverage = 0.3;
  c.lazy_reward = -0.25;
  r.kernel_coverage = 0.1;
  CHECK(rejected_as_lazy(c, r));
  CHECK(compute_reward(c, r) == -0.25);
  r.kernel_coverage = 0.5;
  CHECK_FALSE(rejected_as_lazy(c, r));
  CHECK(compute_reward(c, r) == Approx(2.0 + 0.25));
  auto wrong = verdict(EvalStatus::incorrect);
  wrong.kernel_coverage = 0.0;
  CHECK_FALSE(rejected_as_lazy(c, wrong));
}

TEST_CASE("an unconfirmed speedup is paid as correct at unconfirmed_speedup until it is confirmed", "[reward]") {
  RewardConfig c;  // default: correct, no credit for the speed
  CHECK(c.unconfirmed_speedup == 1.0);
  CHECK(compute_reward(c, verdict(EvalStatus::unconfirmed, 3255.0)) == 1.0);
  CHECK(compute_reward(c, verdict(EvalStatus::ok, 3255.0)) == 3255.0);  // once confirmed: ok, paid in full
  CHECK(is_verdict(EvalStatus::unconfirmed));
  c.unconfirmed_speedup = 10;  // pays up to the review threshold
  CHECK(compute_reward(c, verdict(EvalStatus::unconfirmed, 3255.0)) == 10.0);
  CHECK(compute_reward(c, verdict(EvalStatus::unconfirmed, 0.5)) == 0.5);  // its own when lower
  c.shape = "threshold";
  c.unconfirmed_speedup = 1.0;
  CHECK(compute_reward(c, verdict(EvalStatus::unconfirmed, 47.0)) == 0.0);  // not faster until confirmed
  c.shape = "speedup";
  c.correct_bonus = 0.25;
  CHECK(compute_reward(c, verdict(EvalStatus::unconfirmed, 47.0)) == 1.25);
  EvalStatus parsed{};
  CHECK(from_string("unconfirmed", parsed));
  CHECK(parsed == EvalStatus::unconfirmed);
  CHECK(to_string(EvalStatus::unconfirmed) == "unconfirmed");
}

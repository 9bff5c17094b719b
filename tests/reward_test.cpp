// The reward is a pure function of the verdict and the [reward] config.
#include "actors/reward.hpp"

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

TEST_CASE("failures earn the configured constants, by kind", "[reward]") {
  RewardConfig c;
  c.incorrect_reward = -0.1;
  c.failure_reward = -0.5;
  c.hacked_reward = -2;
  CHECK(compute_reward(c, verdict(EvalStatus::incorrect, 3.0)) == -0.1);
  CHECK(compute_reward(c, verdict(EvalStatus::hacked, 3.0)) == -2);
  for (auto s : {EvalStatus::format_error, EvalStatus::compile_error, EvalStatus::runtime_error,
                 EvalStatus::timeout})
    CHECK(compute_reward(c, verdict(s, 3.0)) == -0.5);
}

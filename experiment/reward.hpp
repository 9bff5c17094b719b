// The reward of a verdict (the reward actor, actors/reward.hpp, applies it): deterministic given the verdict, the [reward] config and (for
// per-task normalization) the correct speedups seen for that task so far.
//   correct:   shape(speedup, or min(speedup, max_speedup) with a cap [/ task mean speedup]) +
//              (unconfirmed, correct but not yet believed: speedup = min(speedup, unconfirmed_speedup))
//              correct_bonus
//              (shape none: 0, the reward is correct_bonus: correctness alone)
//              + coverage_weight * kernel_coverage   (coverage measured on GPU only)
//              ... or lazy_reward when measured coverage < min_coverage (rejected as lazy)
//   incorrect: incorrect_reward; hacked: hacked_reward (default 0); other failures: failure_reward
#pragma once

#include "core/config.hpp"
#include "messages/messages.hpp"

namespace kernelrl {

// The reward of one verdict under `cfg`. `task_mean_speedup` is the running mean of this task's
// correct speedups (used when cfg.normalize == "task_mean"; <= 0: no normalization yet).
double compute_reward(const RewardConfig& cfg, const EvalResult& r, double task_mean_speedup = 0);

// The speedup the reward pays for: an unconfirmed verdict's at most [reward] unconfirmed_speedup.
double paid_speedup(const RewardConfig& cfg, const EvalResult& r);

// The speedup the reward sees: the raw one, or clipped to [reward] max_speedup when it is set.
double capped_speedup(const RewardConfig& cfg, double speedup);

// Whether a correct verdict is rejected as lazy (its measured kernel coverage is too low).
bool rejected_as_lazy(const RewardConfig& cfg, const EvalResult& r);

}  // namespace kernelrl

// reward: EvalResult -> reward, deterministic given the verdict, the [reward] config and (for
// per-task normalization) the correct speedups the actor has seen for that task so far.
//   correct:   shape(speedup, or min(speedup, max_speedup) with a cap [/ task mean speedup]) +
//              (unconfirmed, correct but not yet believed: speedup = min(speedup, unconfirmed_speedup))
//              correct_bonus
//              (shape none: 0, the reward is correct_bonus: correctness alone)
//              + coverage_weight * kernel_coverage   (coverage measured on GPU only)
//              ... or lazy_reward when measured coverage < min_coverage (rejected as lazy)
//   incorrect: incorrect_reward; hacked: hacked_reward (default 0); other failures: failure_reward
// Messages in:  (score_atom, Rollout, EvalResult)
// Messages out: (record_atom, ScoredRollout) -> recorder (the supervisor, which hands the learner
//               what its experiment accepts)
#pragma once

#include "core/config.hpp"
#include "messages/messages.hpp"

#include <caf/fwd.hpp>

namespace kernelrl {

// The reward of one verdict under `cfg`. `task_mean_speedup` is the running mean of this task's
// correct speedups (used when cfg.normalize == "task_mean"; <= 0: no normalization yet).
double compute_reward(const RewardConfig& cfg, const EvalResult& r, double task_mean_speedup = 0);

// The speedup the reward pays for: an unconfirmed verdict's at most [reward] unconfirmed_speedup.
double paid_speedup(const RewardConfig& cfg, const EvalResult& r);

// Whether a correct verdict is rejected as lazy (its measured kernel coverage is too low).
bool rejected_as_lazy(const RewardConfig& cfg, const EvalResult& r);

caf::actor spawn_reward(caf::actor_system& sys, RewardConfig cfg, caf::actor recorder);

}  // namespace kernelrl

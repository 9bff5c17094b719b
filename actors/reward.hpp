// reward: EvalResult -> reward, pure and deterministic. Correct samples earn their (clipped)
// speedup, shaped as configured, plus a bonus; failures earn the configured constants.
// Messages in:  (score_atom, Rollout, EvalResult)
// Messages out: (record_atom, ScoredRollout) -> recorder (the supervisor);
//               (train_atom, ScoredRollout) -> learner, when there is one
#pragma once

#include "core/config.hpp"
#include "messages/messages.hpp"

#include <caf/fwd.hpp>

namespace kernelrl {

// The reward of one verdict under `cfg`.
double compute_reward(const RewardConfig& cfg, const EvalResult& r);

// `learner` may be a default (invalid) actor: then nothing is sent to it.
caf::actor spawn_reward(caf::actor_system& sys, RewardConfig cfg, caf::actor recorder,
                        caf::actor learner);

}  // namespace kernelrl

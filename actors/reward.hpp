// reward: the actor that scores each verdict (experiment/reward.hpp: the formula), keeping each
// task's running mean of correct speedups for [reward] normalize = "task_mean".
// Messages in:  (score_atom, Rollout, EvalResult)
// Messages out: (record_atom, ScoredRollout) -> recorder (the supervisor, which hands the learner
//               what its experiment accepts)
#pragma once

#include "core/config.hpp"
#include "experiment/reward.hpp"
#include "messages/messages.hpp"

#include <caf/fwd.hpp>

namespace kernelrl {

caf::actor spawn_reward(caf::actor_system& sys, RewardConfig cfg, caf::actor recorder);

}  // namespace kernelrl

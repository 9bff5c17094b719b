// reward: the actor that scores each verdict (experiment/reward.hpp: the formula), keeping each
// task's running mean of correct speedups for [reward] normalize = "task_mean".
// Interface: reward_actor (messages/interfaces.hpp)
// Messages in:  (score_atom, Rollout, EvalResult)
// Messages out: (record_atom, ScoredRollout) -> recorder (the supervisor, which hands the learner
//               what its experiment accepts)
#pragma once

#include "core/config.hpp"
#include "experiment/reward.hpp"
#include "messages/interfaces.hpp"
#include "messages/messages.hpp"

#include <caf/fwd.hpp>

namespace kernelrl {

reward_actor spawn_reward(caf::actor_system& sys, RewardConfig cfg, score_recorder recorder);

}  // namespace kernelrl

#include "actors/reward.hpp"

#include <caf/all.hpp>

#include <map>

namespace kernelrl {

namespace {

struct reward_state {
  std::map<std::string, std::pair<double, uint64_t>> task_speedups;  // task -> (sum, count)
  static inline const char* name = "reward";
};

reward_actor::behavior_type reward_behavior(reward_actor::stateful_pointer<reward_state> self, RewardConfig cfg,
                                            score_recorder recorder) {
  return {
      [=](score_atom, Rollout& ro, EvalResult& res) {
        auto& acc = self->state.task_speedups[res.task_id];
        double mean = acc.second ? acc.first / static_cast<double>(acc.second) : 0.0;
        ScoredRollout s;
        s.reward = compute_reward(cfg, res, mean);
        if ((res.status == EvalStatus::ok || res.status == EvalStatus::unconfirmed) && res.speedup > 0) {
          acc.first += capped_speedup(cfg, paid_speedup(cfg, res));
          acc.second += 1;
        }
        s.rollout = std::move(ro);
        s.result = std::move(res);
        // (anonymously: a record needs no sender)
        caf::anon_send(recorder, record_atom::value, std::move(s));
      },
  };
}

}  // namespace

reward_actor spawn_reward(caf::actor_system& sys, RewardConfig cfg, score_recorder recorder) {
  return sys.spawn(reward_behavior, std::move(cfg), std::move(recorder));
}

}  // namespace kernelrl

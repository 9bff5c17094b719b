#include "actors/reward.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <cmath>

namespace kernelrl {

double compute_reward(const RewardConfig& cfg, const EvalResult& r) {
  switch (r.status) {
    case EvalStatus::ok: {
      double s = std::clamp(r.speedup, 0.0, cfg.max_speedup);
      double shaped = cfg.shape == "log_speedup" ? std::log(std::max(s, 1e-9)) : s;
      return shaped + cfg.correct_bonus;
    }
    case EvalStatus::incorrect: return cfg.incorrect_reward;
    case EvalStatus::hacked: return cfg.hacked_reward;
    default: return cfg.failure_reward;
  }
}

namespace {

caf::behavior reward_actor(caf::event_based_actor* self, RewardConfig cfg, caf::actor recorder,
                           caf::actor learner) {
  return {
      [=](score_atom, Rollout& ro, EvalResult& res) {
        ScoredRollout s;
        s.reward = compute_reward(cfg, res);
        s.rollout = std::move(ro);
        s.result = std::move(res);
        if (learner) self->send(learner, train_atom::value, s);
        self->send(recorder, record_atom::value, std::move(s));
      },
  };
}

}  // namespace

caf::actor spawn_reward(caf::actor_system& sys, RewardConfig cfg, caf::actor recorder,
                        caf::actor learner) {
  return sys.spawn(reward_actor, std::move(cfg), std::move(recorder), std::move(learner));
}

}  // namespace kernelrl

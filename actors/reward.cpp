#include "actors/reward.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <cmath>
#include <map>

namespace kernelrl {

bool rejected_as_lazy(const RewardConfig& cfg, const EvalResult& r) {
  return (r.status == EvalStatus::ok || r.status == EvalStatus::unconfirmed) && cfg.min_coverage > 0 &&
         r.kernel_coverage >= 0 && r.kernel_coverage < cfg.min_coverage;
}

namespace {
// The speedup the reward sees: the raw one, or clipped to [reward] max_speedup when it is set.
double capped(const RewardConfig& cfg, double speedup) {
  return cfg.max_speedup > 0 ? std::clamp(speedup, 0.0, cfg.max_speedup) : std::max(speedup, 0.0);
}
}  // namespace

double paid_speedup(const RewardConfig& cfg, const EvalResult& r) {
  if (r.status == EvalStatus::unconfirmed) return std::min(r.speedup, cfg.unconfirmed_speedup);
  return r.speedup;
}

double compute_reward(const RewardConfig& cfg, const EvalResult& r, double task_mean_speedup) {
  switch (r.status) {
    case EvalStatus::ok:
    case EvalStatus::unconfirmed: {  // correct; its speed paid only up to unconfirmed_speedup
      if (rejected_as_lazy(cfg, r)) return cfg.lazy_reward;
      const double speedup = paid_speedup(cfg, r);
      double s = capped(cfg, speedup);
      if (cfg.normalize == "task_mean" && task_mean_speedup > 0) s /= task_mean_speedup;
      double shaped = cfg.shape == "log_speedup" ? std::log(std::max(s, 1e-9))
                      : cfg.shape == "none"      ? 0.0
                      : cfg.shape == "threshold" ? (speedup > cfg.threshold ? 1.0 : 0.0)
                                                 : s;
      double coverage = r.kernel_coverage >= 0 ? cfg.coverage_weight * r.kernel_coverage : 0.0;
      return shaped + cfg.correct_bonus + coverage;
    }
    case EvalStatus::incorrect:
      return cfg.incorrect_reward;
    case EvalStatus::hacked:
      return cfg.hacked_reward;
    case EvalStatus::skipped:        // never evaluated: no verdict to reward
    case EvalStatus::out_of_memory:  // the evaluation did not fit the device: no verdict either
      return 0;
    default:
      return cfg.failure_reward;
  }
}

namespace {

struct reward_state {
  std::map<std::string, std::pair<double, uint64_t>> task_speedups;  // task -> (sum, count)
  static inline const char* name = "reward";
};

caf::behavior reward_actor(caf::stateful_actor<reward_state>* self, RewardConfig cfg, caf::actor recorder) {
  return {
      [=](score_atom, Rollout& ro, EvalResult& res) {
        auto& acc = self->state.task_speedups[res.task_id];
        double mean = acc.second ? acc.first / static_cast<double>(acc.second) : 0.0;
        ScoredRollout s;
        s.reward = compute_reward(cfg, res, mean);
        if ((res.status == EvalStatus::ok || res.status == EvalStatus::unconfirmed) && res.speedup > 0) {
          acc.first += capped(cfg, paid_speedup(cfg, res));
          acc.second += 1;
        }
        s.rollout = std::move(ro);
        s.result = std::move(res);
        self->send(recorder, record_atom::value, std::move(s));
      },
  };
}

}  // namespace

caf::actor spawn_reward(caf::actor_system& sys, RewardConfig cfg, caf::actor recorder) {
  return sys.spawn(reward_actor, std::move(cfg), std::move(recorder));
}

}  // namespace kernelrl

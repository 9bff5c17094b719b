#include "experiment/reward.hpp"

#include <algorithm>
#include <cmath>

namespace kernelrl {

bool rejected_as_lazy(const RewardConfig& cfg, const EvalResult& r) {
  return (r.status == EvalStatus::ok || r.status == EvalStatus::unconfirmed) && cfg.min_coverage > 0 &&
         r.kernel_coverage >= 0 && r.kernel_coverage < cfg.min_coverage;
}

double capped_speedup(const RewardConfig& cfg, double speedup) {
  return cfg.max_speedup > 0 ? std::clamp(speedup, 0.0, cfg.max_speedup) : std::max(speedup, 0.0);
}

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
      double s = capped_speedup(cfg, speedup);
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

}  // namespace kernelrl

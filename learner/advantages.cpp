#include "learner/advantages.hpp"

#include <cmath>
#include <stdexcept>

namespace kernelrl {

GroupAdvantages group_advantages(const std::vector<double>& rewards, const AdvantageOptions& o) {
  const size_t g = rewards.size();
  if (g < 2) throw std::invalid_argument("advantages: a group needs at least 2 samples, got " + std::to_string(g));
  if (o.estimator != "grpo" && o.estimator != "dr_grpo" && o.estimator != "rloo")
    throw std::invalid_argument("advantages: estimator \"" + o.estimator + "\" (expected grpo, dr_grpo or rloo)");
  GroupAdvantages out;
  out.advantages.assign(g, 0.0);
  double sum = 0;
  for (double r : rewards) sum += r;
  const double mean = sum / double(g);
  bool equal = true;
  for (double r : rewards) equal = equal && r == rewards[0];
  if (equal) {
    out.skipped = true;
    return out;
  }
  if (o.estimator == "rloo") {
    for (size_t i = 0; i < g; ++i) out.advantages[i] = rewards[i] - (sum - rewards[i]) / double(g - 1);
    return out;
  }
  double std = 0;
  if (o.estimator == "grpo") {
    double ss = 0;
    for (double r : rewards) ss += (r - mean) * (r - mean);
    std = std::sqrt(ss / double(g - 1));
  }
  for (size_t i = 0; i < g; ++i)
    out.advantages[i] = o.estimator == "grpo" ? (rewards[i] - mean) / (std + o.eps) : rewards[i] - mean;
  return out;
}

}  // namespace kernelrl

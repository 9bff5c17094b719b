#include "learner/advantages.hpp"

#include <cmath>
#include <stdexcept>

namespace kernelrl {

GroupAdvantages group_advantages(const std::vector<double>& rewards, const AdvantageOptions& o) {
  const size_t g = rewards.size();
  if (g < 2) throw std::invalid_argument("advantages: a group needs at least 2 samples, got " + std::to_string(g));
  if (o.estimator != "grpo" && o.estimator != "dr_grpo" && o.estimator != "rloo" && o.estimator != "trloo")
    throw std::invalid_argument("advantages: estimator \"" + o.estimator +
                                "\" (expected grpo, dr_grpo, rloo or trloo)");
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
  if (o.estimator == "rloo" || o.estimator == "trloo") {
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

std::vector<double> turn_returns(const std::vector<double>& rewards, double gamma, double progress) {
  std::vector<double> g(rewards.size());
  double next = 0;
  for (size_t t = rewards.size(); t-- > 0;) next = g[t] = rewards[t] + (t + 1 < rewards.size() ? gamma * next : 0.0);
  for (size_t t = 1; t < rewards.size(); ++t) g[t] += progress * (rewards[t] - rewards[t - 1]);
  return g;
}

EpisodeAdvantages episode_advantages(const std::vector<std::vector<double>>& rewards, double gamma,
                                     const AdvantageOptions& o) {
  const size_t turns = rewards.empty() ? 0 : rewards[0].size();
  std::vector<std::vector<double>> returns;
  for (auto& e : rewards) {
    if (e.size() != turns) throw std::invalid_argument("advantages: the episodes have different numbers of turns");
    returns.push_back(turn_returns(e, gamma));
  }
  EpisodeAdvantages out;
  out.advantages.assign(rewards.size(), std::vector<double>(turns, 0.0));
  for (size_t t = 0; t < turns; ++t) {
    std::vector<double> at;
    for (auto& e : returns) at.push_back(e[t]);
    auto g = group_advantages(at, o);
    out.skipped.push_back(g.skipped);
    for (size_t e = 0; e < returns.size(); ++e) out.advantages[e][t] = g.advantages[e];
  }
  return out;
}

}  // namespace kernelrl

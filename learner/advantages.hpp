// Group advantages for GRPO-family updates: one group is the G samples of one task in one step.
// Torch-free; the learner turns them into per-sequence (or, for SDPO, per-token) advantages.
#pragma once

#include <string>
#include <vector>

namespace kernelrl {

struct AdvantageOptions {
  // grpo: (r - mean) / (std + eps), std the unbiased (G - 1) one, as GRPO and TRL compute it;
  // dr_grpo: r - mean (no std scaling, Dr. GRPO); rloo: r - mean of the other G - 1 rewards.
  std::string estimator = "grpo";
  double eps = 1e-4;  // added to the std (grpo)
};

struct GroupAdvantages {
  std::vector<double> advantages;  // one per sample, in the order given (zeros when skipped)
  bool skipped = false;            // every reward equal: no signal; the group is left out and counted
};

// Throws std::invalid_argument for an unknown estimator or a group of fewer than 2 samples.
GroupAdvantages group_advantages(const std::vector<double>& rewards, const AdvantageOptions& o);

}  // namespace kernelrl

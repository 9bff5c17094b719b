// Group advantages for GRPO-family updates: one group is the G samples of one task in one step.
// Torch-free; the learner turns them into per-sequence (or, for SDPO, per-token) advantages.
#pragma once

#include <string>
#include <vector>

namespace kernelrl {

struct AdvantageOptions {
  // grpo: (r - mean) / (std + eps), std the unbiased (G - 1) one, as GRPO and TRL compute it;
  // dr_grpo: r - mean (no std scaling, Dr. GRPO); rloo: r - mean of the other G - 1 rewards;
  // trloo: rloo's formula over one turn's group of a multi-turn run, whose values are the
  // episodes' returns at that turn (episode_advantages): the turn-level REINFORCE leave-one-out
  // of Dr. Kernel. With one turn it is rloo.
  std::string estimator = "grpo";
  double eps = 1e-4;  // added to the std (grpo)
};

struct GroupAdvantages {
  std::vector<double> advantages;  // one per sample, in the order given (zeros when skipped)
  bool skipped = false;            // every reward equal: no signal; the group is left out and counted
};

// Throws std::invalid_argument for an unknown estimator or a group of fewer than 2 samples.
GroupAdvantages group_advantages(const std::vector<double>& rewards, const AdvantageOptions& o);

// Multi-turn: what each turn of one episode learns from, given its turns' rewards (in turn order):
// its return G_t = r_t + gamma * G_{t+1} (G_T = r_T), and for a later turn a bonus for its
// progress over the turn before, + progress * (r_t - r_{t-1}) (SCoRe's reward shaping: a later
// turn that only repeats a good answer earns no more than it, one that repairs or improves earns
// more). The bonus is the turn's own: earlier turns' returns are of the rewards as they are, so a
// first turn is never paid for a worse answer that a later turn then improves on.
std::vector<double> turn_returns(const std::vector<double>& rewards, double gamma, double progress = 0.0);

// A group's episodes (rewards[e][t]: episode e's reward at turn t, every episode with the same
// number of turns): each turn's advantages over the episodes' returns at that turn, as the learner
// computes them from the turn's group (advantages[e][t]; skipped[t]: that turn's returns are all
// equal). With estimator trloo (or rloo): TRLOO.
struct EpisodeAdvantages {
  std::vector<std::vector<double>> advantages;
  std::vector<bool> skipped;
};
EpisodeAdvantages episode_advantages(const std::vector<std::vector<double>>& rewards, double gamma,
                                     const AdvantageOptions& o);

}  // namespace kernelrl

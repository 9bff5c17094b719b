// The group-relative objective (modes train and ttt): each sample's advantage is its reward
// against its group's (learner/advantages.hpp: grpo, dr_grpo, rloo), one per sequence; or, where
// the experiment gives them (multi-turn returns), the samples' own per-token advantages.
#include "learner/advantages.hpp"
#include "learner/objective.hpp"

#include <algorithm>

namespace kernelrl {

namespace {

class GroupRelative : public Objective {
 public:
  explicit GroupRelative(const LearnerOptions& o) {
    opt_.estimator = o.learner.algorithm;
    opt_.eps = o.learner.adv_eps;
  }

  GroupOutcome plan(const std::vector<LearnSample>& group) const override {
    GroupOutcome out;
    if (check_samples(group)) {
      for (auto& s : group)
        if (s.token_advantages.empty() && !s.token_ids.empty())
          throw LearnerError("learner: a group mixes per-token and per-sequence advantages");
      return out;
    }
    std::vector<double> rewards;
    for (auto& s : group) rewards.push_back(s.reward);
    GroupAdvantages ga;
    try {
      ga = group_advantages(rewards, opt_);
    } catch (const std::exception& e) {
      throw LearnerError(std::string("learner: ") + e.what());
    }
    out.advantages = ga.advantages;
    out.skipped = ga.skipped;
    return out;
  }

  bool needs_policy() const override { return false; }

  std::vector<std::vector<float>> token_advantages(const std::vector<LearnSample>& group, const PolicyScores&,
                                                   GroupOutcome&) const override {
    // The experiment's own per-token advantages (plan() checked every sample has them), or none.
    const bool per_token =
        std::any_of(group.begin(), group.end(), [](const LearnSample& s) { return !s.token_advantages.empty(); });
    std::vector<std::vector<float>> adv;
    if (per_token)
      for (auto& s : group) adv.push_back(s.token_advantages);
    return adv;
  }

 private:
  AdvantageOptions opt_;
};

}  // namespace

std::unique_ptr<Objective> group_relative_objective(const LearnerOptions& o) {
  return std::make_unique<GroupRelative>(o);
}

}  // namespace kernelrl

#include "learner/objective.hpp"

namespace kernelrl {

bool check_samples(const std::vector<LearnSample>& group) {
  bool per_token = false;
  for (size_t i = 0; i < group.size(); ++i) {
    const auto& s = group[i];
    if (s.logprobs.size() != s.token_ids.size())
      throw LearnerError("learner: sample " + std::to_string(i) + " of the group has " +
                         std::to_string(s.token_ids.size()) + " tokens but " + std::to_string(s.logprobs.size()) +
                         " logprobs");
    if (!s.token_advantages.empty()) {
      if (s.token_advantages.size() != s.token_ids.size())
        throw LearnerError("learner: sample " + std::to_string(i) + ": token_advantages has " +
                           std::to_string(s.token_advantages.size()) + " entries for " +
                           std::to_string(s.token_ids.size()) + " tokens");
      per_token = true;
    }
  }
  return per_token;
}

std::unique_ptr<Objective> make_objective(const LearnerOptions& o) {
  if (o.objective == "grpo") return group_relative_objective(o);
  if (o.objective == "sdpo") return self_distillation_objective(o);
  throw LearnerError("learner: objective \"" + o.objective + "\": expected grpo or sdpo");
}

}  // namespace kernelrl

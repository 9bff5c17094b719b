// The self-distillation objective (mode sdpo; learner/sdpo.hpp): the teacher is the policy itself
// given each sample's teacher_prompt; a token's advantage is beta * (teacher - student logprob).
// A sample without a teacher prompt carries no signal and is left out.
#include "learner/objective.hpp"

#include <algorithm>

namespace kernelrl {

namespace {

class SelfDistillation : public Objective {
 public:
  explicit SelfDistillation(const LearnerOptions& o) : beta_(o.sdpo_beta) {}

  GroupOutcome plan(const std::vector<LearnSample>& group) const override {
    check_samples(group);
    return {};  // the advantages need the policy's scores (token_advantages)
  }

  bool needs_policy() const override { return true; }

  std::vector<std::vector<float>> token_advantages(const std::vector<LearnSample>& group, const PolicyScores& policy,
                                                   GroupOutcome& out) const override {
    out.teacher_logprob_sum.assign(group.size(), 0.0);
    out.student_logprob_sum.assign(group.size(), 0.0);
    out.teacher_tokens.assign(group.size(), 0);
    std::vector<std::vector<float>> adv(group.size());
    const size_t mb = std::max<size_t>(1, policy.minibatch);
    std::vector<size_t> rows;
    for (size_t i = 0; i < group.size(); ++i)
      if (!group[i].teacher_prompt.empty() && !group[i].token_ids.empty()) rows.push_back(i);
    for (size_t b0 = 0; b0 < rows.size(); b0 += mb) {
      std::vector<std::vector<int32_t>> prompts, comps;
      for (size_t k = b0; k < std::min(rows.size(), b0 + mb); ++k) {
        prompts.push_back(policy.encode(group[rows[k]].teacher_prompt));
        comps.push_back(group[rows[k]].token_ids);
      }
      std::vector<std::vector<float>> t;
      try {
        t = policy.score(prompts, comps);
      } catch (const std::exception& e) {
        throw LearnerError(std::string("learner: teacher scoring failed: ") + e.what());
      }
      for (size_t k = b0; k < std::min(rows.size(), b0 + mb); ++k) {
        const size_t i = rows[k];
        const auto& tl = t[k - b0];
        auto& a = adv[i];
        for (size_t j = 0; j < tl.size(); ++j) {
          a.push_back(float(beta_ * (double(tl[j]) - double(group[i].logprobs[j]))));
          out.teacher_logprob_sum[i] += tl[j];
          out.student_logprob_sum[i] += group[i].logprobs[j];
        }
        out.teacher_tokens[i] = prompts[k - b0].size() + comps[k - b0].size();
      }
    }
    if (rows.empty()) out.skipped = true;
    return adv;
  }

 private:
  double beta_;
};

}  // namespace

std::unique_ptr<Objective> self_distillation_objective(const LearnerOptions& o) {
  return std::make_unique<SelfDistillation>(o);
}

}  // namespace kernelrl

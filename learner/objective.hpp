// How a learner turns a group of scored samples into advantages: one Objective per [experiment]
// mode's objective (core/mode.hpp traits), each in a file of its own (objective_grpo.cpp,
// objective_sdpo.cpp), made by make_objective. Torch-free: an objective that needs the policy's
// scores asks for them through PolicyScores, which the engine (learner/lora_learner.cpp) provides.
#pragma once

#include "learner/lora_learner.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kernelrl {

// What an objective may ask of the policy being trained.
struct PolicyScores {
  std::function<std::vector<int32_t>(const std::string&)> encode;  // a prompt's token ids
  // Each completion's per-token logprobs after its prompt under the current policy (no gradient).
  std::function<std::vector<std::vector<float>>(const std::vector<std::vector<int32_t>>& prompts,
                                                const std::vector<std::vector<int32_t>>& completions)>
      score;
  size_t minibatch = 8;  // rows scored at once
};

class Objective {
 public:
  virtual ~Objective() = default;
  // Checks the group's samples (their logprobs and token advantages, each sample's count against its
  // tokens) and decides what needs no model: per-sequence advantages from the rewards, or that the
  // group teaches nothing (`skipped`). Throws LearnerError naming what is wrong.
  virtual GroupOutcome plan(const std::vector<LearnSample>& group) const = 0;
  // Whether advantages() needs the policy's scores (then a data-parallel learner waits for the rank
  // that computes them before it answers).
  virtual bool needs_policy() const = 0;
  // Per-token advantages of each sample, after plan() (one vector a sample, empty where the sample
  // is left out), or none at all: then each sample learns from out.advantages, per sequence. May
  // fill out's figures, or set out.skipped when nothing is left to learn from.
  virtual std::vector<std::vector<float>> token_advantages(const std::vector<LearnSample>& group,
                                                           const PolicyScores& policy, GroupOutcome& out) const = 0;
};

// The objective `o.objective` names ("grpo" or "sdpo"); throws LearnerError for any other.
std::unique_ptr<Objective> make_objective(const LearnerOptions& o);

// For every objective: each sample's logprobs, and token advantages where given, one per token;
// whether any sample carries token advantages. Throws LearnerError naming the sample.
bool check_samples(const std::vector<LearnSample>& group);

// The objectives (objective_grpo.cpp, objective_sdpo.cpp).
std::unique_ptr<Objective> group_relative_objective(const LearnerOptions& o);
std::unique_ptr<Objective> self_distillation_objective(const LearnerOptions& o);

}  // namespace kernelrl

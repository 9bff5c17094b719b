// SDPO (self-distillation policy optimization): the teacher is the policy itself, shown more than
// the student saw. For every sample of a group the teacher's context is the task's prompt plus a
// section the student never had: optionally a correct solution from the same group (another
// sample's, never the sample's own) and, in the "feedback" variant, structured execution feedback
// on the sample (compile status, correctness, speedup, runtime, error text) - never its code.
// The learner scores the sample's tokens under that context; each token's advantage is
// beta * (teacher logprob - student logprob). Torch-free: the learner actor builds the sections
// here, the engine (learner/lora_learner) does the scoring.
#pragma once

#include "core/config.hpp"
#include "messages/messages.hpp"

#include <string>
#include <vector>

namespace kernelrl {

// Structured feedback on one evaluation, as the teacher reads it. Contains no candidate code.
std::string execution_feedback(const EvalResult& r, size_t max_error_chars);  // ([sdpo] max_error_chars)

// The teacher-only section for each sample of `group` (same order); "" where the teacher would
// know nothing the student did not (prompt variant, no other correct sample): such a sample
// carries no SDPO signal. The demonstration for sample i is the fastest correct sample j != i.
std::vector<std::string> teacher_sections(const std::vector<ScoredRollout>& group, const SdpoConfig& o);

// The teacher's user message: the student's user message followed by the section.
std::string teacher_user_message(const std::string& user, const std::string& section);

}  // namespace kernelrl

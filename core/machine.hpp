#pragma once
// What this machine can give the run: its memory, and how the candidates' memory limit is shared
// out over the candidates that can run on it at once.

#include "core/config.hpp"

#include <cstdint>
#include <string>

namespace kernelrl {

// The memory this process's machine has for it, in MB: MemTotal, or a lower limit of the control
// group it runs in (a container's). 0 when it cannot be read.
uint64_t machine_memory_mb();

// The candidates' memory on one machine: `at_once` processes (each evaluator's timing stage and
// its compile workers) of at most `per_candidate_mb` each, out of `machine_mb` less `headroom_mb`
// for the head, the workers themselves and the compilers.
struct MemoryPlan {
  uint64_t machine_mb = 0, headroom_mb = 0;
  uint32_t at_once = 0;
  uint32_t per_candidate_mb = 0;  // 0: no limit
  bool is_auto = false;           // derived from the machine ([evaluator] memory_limit_mb = "auto")
  // Whether the candidates together could take more than the machine has for them.
  bool exceeds() const;
  // One line: the limit, how it was reached, and the sum against the machine.
  std::string describe() const;
  // What to change when it exceeds: the limit, or (already "auto") how many run at once.
  std::string advice() const;
};

// The plan for `evaluators` evaluators of settings `e` on a machine of `machine_mb`.
MemoryPlan plan_candidate_memory(const EvaluatorConfig& e, uint32_t evaluators, uint64_t machine_mb);

// What a run holds at once on the head's machine: the samples of one generation ([sampler]
// batch_prompts prompts x the samples of each) and, in a learning mode, the rollouts of a step
// ([learner] batch_size x group_size) until the learner has them, each with its prompt,
// completion, token ids and logprobs: about 16 bytes a completion token and 16 KiB besides.
struct StepPlan {
  uint64_t generation = 0;  // samples generated together (0: a replay sampler generates none)
  uint64_t step = 0;        // samples of a learning step (0: the mode does not learn)
  uint64_t bytes_per_sample = 0;
  uint64_t machine_mb = 0;
  // "" when both fit in half the machine; else what does not, with the keys to lower.
  std::string problem() const;
};
StepPlan plan_step(const Config& cfg, uint64_t machine_mb);

}  // namespace kernelrl

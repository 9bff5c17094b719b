// sampler: turns the experiment's plan for a step into Rollouts and sends them to the dispatcher.
// Backend in this build: replay (actions recorded in JSONL files or in an earlier run's store).
// Messages in:  (plan_atom, uint32_t step) -> replies uint64_t (rollouts sent for that step)
// Messages out: Rollout -> dispatcher, as a request answered once its queue has room; at most
//               `window` unanswered at a time (backpressure)
#pragma once

#include "messages/messages.hpp"

#include <caf/fwd.hpp>

#include <string>
#include <vector>

namespace kernelrl {

class TaskSet;

// One recorded action. Replay JSONL lines are objects with "task_id" and "completion" (required)
// and optionally "prompt", "token_ids", "logprobs", "policy_version"; other keys are ignored.
struct ReplayRecord {
  std::string task_id, prompt, completion;
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;
  uint64_t policy_version = 0;
  std::string origin;  // FILE:LINE (or STORE:sample_id) it came from
};

// Reads actions from a JSONL file, a folder of *.jsonl files (sorted by name) or a run directory
// (its store.sqlite). A bad line is reported in `errors` as "FILE:LINE: what is wrong" and skipped.
std::vector<ReplayRecord> load_replay(const std::string& path, std::vector<std::string>& errors);

struct SamplerArgs {
  std::string id = "sampler-0";       // sampler name, recorded with every rollout
  std::vector<ReplayRecord> records;  // replay actions, in order
  uint32_t samples_per_task = 0;      // at most this many actions per task (0: all)
  uint32_t window = 16;               // rollouts handed to the dispatcher and not yet answered
};

caf::actor spawn_sampler(caf::actor_system& sys, SamplerArgs args, caf::actor dispatcher);

}  // namespace kernelrl

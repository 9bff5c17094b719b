// What a run reads before anything starts, on the head and on the nodes that render prompts:
// the experiment's tasks (and its held-out tasks), each task's prompt as the samplers render it
// and their digest, or the actions a replay run evaluates.
#pragma once

#include "actors/sampler.hpp"
#include "core/config.hpp"
#include "core/task_set.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kernelrl {

// The config's tasks, and the held-out tasks of its periodic evaluation (none without one).
bool load_experiment_tasks(const Config& cfg, TaskSet& tasks, TaskSet& eval_tasks, std::string& err);

struct RenderedPrompt {
  std::string task_id, split;  // split: "" for [tasks], "eval" for an eval task
  std::string user, prompt;    // the user message, and the prompt the sampler sends
  uint32_t prompt_tokens = 0;  // its tokens under [policy] model's tokenizer (0: no tokenizer there)
};
// Each task's prompt as the sampler renders it: the tasks, then the eval tasks not among them.
bool render_task_prompts(const Config& cfg, const TaskSet& tasks, const TaskSet& eval_tasks,
                         std::vector<RenderedPrompt>& out, std::string& err);
// SHA-256 (hex) over every rendered task's id and prompt, in task-id order: a sampler node's
// must equal the head's (the same tasks, template and model tokenizer's chat format), else the
// head refuses its samplers.
std::string prompts_digest(const std::vector<RenderedPrompt>& prompts);

// What a run reads before anything starts: its tasks, and the replayed actions or each task's prompt.
struct RunInputs {
  TaskSet tasks, eval_tasks;  // eval_tasks: the held-out tasks of a learning run's rounds
  std::vector<ReplayRecord> records;
  std::vector<SamplerArgs::TaskPrompt> prompts;
  std::map<std::string, std::string> user_messages;  // by task: what the student was asked (SDPO's teacher sees more)
  std::string prompts_digest;                        // sampler nodes must render the same prompts
  std::vector<std::string> ids(const TaskSet& set) const;
};

// The run's tasks, and its prompts (or, with the replay sampler, its replayed actions: those of
// the selected tasks); nullopt after logging why not.
std::optional<RunInputs> read_inputs(const Config& cfg);

}  // namespace kernelrl

// sampler: turns the experiment's plan for a step into Rollouts and sends them to the dispatcher.
// Backends: replay (actions recorded in JSONL files or in an earlier run's store), libtorch and
// openai (policy/sampler_backend.hpp; the actor then runs detached, on a thread of its own,
// generating batch_prompts prompts at a time so rollouts stream out while later ones generate).
// Interface: sampler_actor (messages/interfaces.hpp).
// Messages in:  (plan_atom, uint32_t step) -> replies uint64_t (rollouts that step will send);
//               SamplePlan -> replies uint64_t (model backends; replay: an error);
//               WeightsUpdate -> replies uint64_t (the version now served) or an error;
//               (tick_atom) (its own: the next batch); (stats_atom) -> Telemetry
// Messages out: Rollout -> dispatcher, as a request answered once its queue has room; at most
//               `window` unanswered at a time (backpressure); (skip_atom, Rollout, why) ->
//               dispatcher for a sample left out by evaluate_top_m
#pragma once

#include "policy/policy.hpp"
#include "messages/interfaces.hpp"
#include "messages/messages.hpp"

#include <caf/fwd.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kernelrl {

class TaskSet;
class SamplerBackend;

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
  // Model backends (null backend: replay `records`).
  std::shared_ptr<SamplerBackend> backend;
  struct TaskPrompt {
    std::string task_id, prompt;
    uint32_t prompt_tokens = 0;  // 0: unknown
    std::string user;            // the task's user message (a later turn's prompt starts with it)
  };
  std::vector<TaskPrompt> prompts;  // one per task, in group order
  // Multi-turn: a later turn's prompt (and its token count, 0: unknown) from the task's user
  // message and the episode's earlier attempts (tasks/prompt.hpp, render_turn_prompt). Unset:
  // plans of later turns are refused.
  struct TurnRender {
    std::string prompt;
    uint32_t tokens = 0;
  };
  std::function<TurnRender(const std::string& user, const std::vector<Attempt>& history)> render_turn;
  SamplingParams params;       // n is samples_per_task (at least 1)
  uint32_t batch_prompts = 8;  // prompts generated together
  // Deployable top-m (best_of_n): of each group's samples only the evaluate_top_m most surprising
  // (lowest mean logprob) go to evaluation; the rest go to the dispatcher as (skip_atom, ...) and
  // are stored unevaluated. 0: evaluate every sample.
  uint32_t evaluate_top_m = 0;
  // Model backends, benchmarks of the loop's pace only ([sampler] bench_actions): a sample of a task
  // listed here leaves with the recorded action at (group id + sample index) mod their count in
  // place of its model's completion; its tokens and logprobs stay the model's.
  std::map<std::string, std::vector<std::string>> bench_actions;
  // Model backends: after this many failed generations in a row the sampler stops (its monitors
  // see it go with the reason; the supervisor plans its unfinished groups on the other samplers).
  // 0: it retries for ever.
  uint32_t max_failures = 0;
};

// `dispatcher`: the dispatcher, or on a sampler node the head's gate (rollout_sink).
sampler_actor spawn_sampler(caf::actor_system& sys, SamplerArgs args, rollout_sink dispatcher);

}  // namespace kernelrl

// dispatcher: the queue in front of every evaluator, local or on other nodes. Turns Rollouts into
// EvalRequests, sends each to the least-loaded evaluator (at most max_in_flight at one; across
// devices a task's samples preferably where its reference is timed already), keeps what each
// evaluator holds, and when one goes down (its process, its node, or a silent link)
// puts all of that back in the queue; after max_attempts failed dispatches a sample is recorded
// as a runtime_error. No sample is lost; a second verdict for a sample (a late answer) is dropped
// and counted, never scored twice. Only this process's actors may send it work or evaluators
// (remote evaluators arrive through the gate).
// Interface: dispatcher_actor (messages/interfaces.hpp).
// Messages in:  Rollout (sampler); (skip_atom, Rollout, std::string why) (sampler: not to be
//               evaluated, scored as skipped); (register_atom, actor, std::string id) (evaluator);
//               (stats_atom) -> Telemetry (task_sites: distinct task x node-and-device
//               dispatches, each a reference timing there)
// Messages out: (eval_atom, EvalRequest) -> evaluator; (score_atom, Rollout, EvalResult) -> reward
#pragma once

#include "messages/interfaces.hpp"
#include "messages/messages.hpp"

#include <caf/fwd.hpp>

#include <map>
#include <string>

namespace kernelrl {

struct DispatcherArgs {
  std::map<std::string, std::string> task_paths;  // task id -> task file
  std::string action_space = "forward_body";      // EvalRequest::action_space
  std::string mode = "fast";                      // EvalRequest::mode
  uint64_t seed = 42;                             // EvalRequest::seed
  uint32_t max_in_flight = 1;                     // per evaluator
  uint32_t max_attempts = 2;                      // dispatches per sample
  uint32_t max_queue = 256;                       // queued rollouts before producers wait
};

dispatcher_actor spawn_dispatcher(caf::actor_system& sys, DispatcherArgs args, reward_actor reward);

}  // namespace kernelrl

// evaluator: one per GPU or CPU slot. Owns one worker process (gpu/worker.py) through a
// WorkerClient; scaffolds, checks and times each candidate there; a crashed or hung worker is
// replaced and the sample gets its verdict (runtime_error / timeout). Runs on its own thread
// (detached), since an evaluation blocks for as long as the candidate runs.
// Messages in:  (eval_atom, EvalRequest) -> EvalResult
// Messages out: (register_atom, self, id) -> dispatcher, once its worker is up
#pragma once

#include "core/config.hpp"
#include "gpu/worker_client.hpp"

#include <caf/fwd.hpp>

namespace kernelrl {

struct EvaluatorArgs {
  std::string id;              // "node/cpu-0", "node/cuda:1"
  WorkerOptions worker;        // how to start its worker
  EvaluatorConfig settings;    // trials, tolerances, time limit
};

caf::actor spawn_evaluator(caf::actor_system& sys, EvaluatorArgs args, caf::actor dispatcher);

}  // namespace kernelrl

// evaluator: one per GPU or CPU slot. A two-stage pipeline in front of worker processes
// (gpu/worker.py, each a fork server running every candidate in its own process):
//   compile stage: `compile_workers` CPU processes build the kernels of candidates that declare
//     any (load_inline, cpp_extension, Triton) into the content-addressed cache;
//   timing stage: one process on the device checks and times candidates, one at a time, taking
//     the next ready candidate as soon as it is free (so it never idles while built work waits).
// A candidate whose build fails gets compile_error without using the device. A crashed or hung
// worker is replaced and the sample still gets its verdict (runtime_error / timeout).
// Messages in:  evaluator_actor (messages/interfaces.hpp): (eval_atom, EvalRequest) -> EvalResult;
//               (withdraw_atom, sample_id): a queued request given back
// Messages out: (register_atom, self, id) -> dispatcher, once its timing worker is up (as caf::actor:
//               it may cross nodes through the gate; the dispatcher casts it back)
#pragma once

#include "core/config.hpp"
#include "gpu/worker_client.hpp"
#include "messages/interfaces.hpp"

#include <caf/fwd.hpp>

namespace kernelrl {

struct EvaluatorArgs {
  std::string id;            // "node/cpu-0", "node/cuda:1"
  WorkerOptions worker;      // how to start its timing worker (compile workers: same, on CPU)
  EvaluatorConfig settings;  // trials, tolerances, limits, compile_workers
};

// `dispatcher` may be invalid (launch evaluate): then nothing is registered.
evaluator_actor spawn_evaluator(caf::actor_system& sys, EvaluatorArgs args, caf::actor dispatcher);

}  // namespace kernelrl

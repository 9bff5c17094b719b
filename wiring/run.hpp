// A run's actors on the head (`launch CONFIG`): every actor of the run made and connected to the
// others (evaluators, supervisor, reward, dispatcher, samplers, the learner where the head has its
// role, the monitor, and in a cluster the gate other nodes join through), the run taken to its
// end, and their shutdown.
#pragma once

#include "core/config.hpp"
#include "messages/interfaces.hpp"
#include "wiring/inputs.hpp"

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kernelrl {

class LearnerEngine;
class SamplerBackend;

// The actors of one run on the head, and their shutdown.
struct RunActors {
  supervisor_actor supervisor;
  gate_actor gate;
  monitor_actor monitor;
  learner_actor learner;
  dispatcher_actor dispatcher;
  reward_actor reward;
  selector_actor selector;
  std::vector<sampler_actor> samplers;
  std::vector<caf::actor> evaluators;
  void stop();
};

// Every actor of the run on this process (the head): evaluators first (their workers take a few
// seconds to import torch), then the rest; in a cluster, the gate other nodes join through,
// listening. `backends`: the head's samplers' (none: the sampler nodes' join); `engine`: the
// learner's where the head has the learner role. Nullopt after logging why not.
std::optional<RunActors> spawn_run(caf::actor_system& sys, const Config& cfg, RunInputs in, const std::string& run_dir,
                                   const std::string& run_id, bool resume,
                                   std::vector<std::shared_ptr<SamplerBackend>> backends,
                                   std::shared_ptr<LearnerEngine> engine, const std::string& secret,
                                   const std::string& config_path);

// Starts the experiment and waits for its end: the supervisor's summary (JSON: its tables, or
// {"ok": false, "error": ...}), after the monitor's last snapshot; the run's actors stopped.
std::string run_to_summary(caf::actor_system& sys, RunActors& run);

}  // namespace kernelrl

// supervisor: the router between the actors and the run's experiment (experiment/experiment.hpp),
// which decides everything about the run. It records every scored sample in the store
// (idempotent by sample id), hands the experiment what happens (the start, stored samples, the
// sampler's plans, the learner's updates) and carries out the actions it answers with: plans to
// the sampler, steps and samples to the learner, rows to the store, scores and keeps to the
// checkpoint selector. It delivers the run summary (JSON) to whoever sent `plan`, and ends every
// run by writing RUN_DIR/compute.json.
// In a learning mode the learner publishes its weights (sync) before the experiment starts; with
// `resume` the experiment gets the store's samples and step rows of the run so far.
// If every evaluator is gone with work left, the run ends with an error instead of hanging (a
// cluster first waits join_wait_s for one to join).
// Several samplers: each plan's groups are spread over them by load (SamplerPool); a sampler that
// goes away has its unfinished groups planned again on the others (a sample stored twice is
// dropped); with none left the run ends with an error, or in a cluster waits join_wait_s for one.
// A sampler that joins from another node ((register_atom, sampler_atom, actor, id), through the
// gate) is first brought to the current policy version by the learner, then takes its share and
// any groups that waited. The learner publishes to all of them.
// (eval and best_of_n sample every task once on the first live sampler; its loss ends the run.)
// The learner on another node (learner_node set, learner not): a learning run starts once that
// node's learner and checkpoint selector register ((register_atom, learner_atom, learner,
// selector, node), through the gate), waiting join_wait_s for them; losing that learner ends the
// run with an error that names its last checkpoint (`launch CONFIG --resume RUN_DIR` continues).
// A cluster's run starts once every node listed with evaluators (evaluator_nodes) has registered
// one, or join_wait_s after the plan came, naming the nodes still missing: a run does not begin
// on the first node's evaluators while the others are still starting.
// Its interface is messages/interfaces.hpp supervisor_actor (the plan, scored samples and
// telemetry to record, the peers that joined, stats); it also watches its samplers and evaluators.
#pragma once

#include "experiment/experiment.hpp"

#include "messages/interfaces.hpp"

#include <caf/actor.hpp>

#include <string>

namespace kernelrl {

struct SupervisorArgs {
  ExperimentArgs experiment;                 // the run (its id and RUN_DIR), its mode, tasks and loop
  std::string store_path;                    // RUN_DIR/store.sqlite
  std::string synchronous = "normal";        // StoreConfig::synchronous
  std::string config_toml;                   // resolved config, kept with the run
  double join_wait_s = 0;                    // cluster: how long to wait for an evaluator to join when
                                             // none is running (0: single node, fail at once)
  bool resume = false;                       // continue a run from its store and checkpoints
  learner_actor learner;                     // learning modes: the learner actor
  selector_actor selector;                   // checkpoint_selector (StepStats score its checkpoints)
  std::string learner_node;                  // learning modes, cluster: the node whose learner joins (learner unset)
  std::vector<std::string> evaluator_nodes;  // cluster: the other listed nodes with evaluators; the run
                                             // starts once each has one registered, or join_wait_s on
};

supervisor_actor spawn_supervisor(caf::actor_system& sys, SupervisorArgs args);

}  // namespace kernelrl

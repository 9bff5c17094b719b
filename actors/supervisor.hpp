// supervisor: owns one experiment. In this build the `eval` experiment: ask the sampler for the
// step's rollouts, record every scored sample in the store (idempotent by sample id), aggregate
// per task, and when every sample has a verdict write the step's StepStats and deliver the run
// summary (JSON) to whoever sent `plan`. If every evaluator is gone with work left, the run ends
// with an error in the summary instead of hanging.
// Messages in:  (plan_atom, actor sampler, vector<actor> evaluators) -> std::string summary JSON; (record_atom, ScoredRollout);
//               (record_atom, Telemetry) (kept in the store);
//               (stats_atom) -> Telemetry; down messages of the evaluators it watches
#pragma once

#include "core/config.hpp"
#include "messages/messages.hpp"

#include <caf/fwd.hpp>

#include <string>
#include <vector>

namespace kernelrl {

struct SupervisorArgs {
  std::string run_id;                 // id of the run in the store
  std::string store_path;             // RUN_DIR/store.sqlite
  std::string synchronous = "normal"; // StoreConfig::synchronous
  std::string mode = "eval";          // ExperimentConfig::mode
  std::string config_toml;            // resolved config, kept with the run
  std::vector<std::string> task_ids;  // tasks of the experiment, in order
  double join_wait_s = 0;             // cluster: how long to wait for an evaluator to join when
                                      // none is running (0: single node, fail at once)
};

caf::actor spawn_supervisor(caf::actor_system& sys, SupervisorArgs args);

// Names of the reward histogram's bins, in order: its telemetry keys are "reward_hist.NAME".
const std::vector<std::string>& reward_histogram_bins();

}  // namespace kernelrl

// supervisor: owns one experiment, records every scored sample in the store (idempotent by sample
// id), aggregates per step and task, and delivers the run summary (JSON) to whoever sent `plan`.
// If every evaluator is gone with work left, the run ends with an error instead of hanging.
// Every run ends by writing RUN_DIR/compute.json: rollouts, student and teacher tokens,
// evaluation seconds (wall, device stage, compile), learner seconds, and `settings`.
//   eval:  the sampler's rollouts of step 0; done when every sample has a verdict.
//   sdpo:  ttt's loop; the learner learns by self-distillation (learner/sdpo.hpp).
//   ttt:   test-time adaptation: train's loop on the same tasks every step (batch = the task set),
//          with Best-of-Adaptation (the step whose samples scored the best fast_1, and its
//          checkpoint) and early stopping after `patience` steps without improvement.
//   train: RLVR. The learner publishes its weights first (sync); then step s asks the sampler for
//          group_size samples of each of batch_size tasks (a deterministic shuffle of the task
//          set per epoch) and tells the learner how many groups to expect. Each complete group
//          goes to the learner unless a sample in it is staler than max_staleness versions
//          behind the newest policy: then the group is rejected, reported, and the task sampled
//          again. Step s+1 is planned once the learner's update of step s - max_staleness is
//          acknowledged by every sampler. A learner error (a failed sync included) ends the run.
//          With `resume`, the run continues from the learner's version: the store's samples of
//          earlier steps are counted once, complete groups of the resumed step are reused.
//          With eval tasks, the served policy of the first version, of every eval_every-th and of
//          the last one samples each eval task (Rollout::split "eval", `step` = the version); those
//          samples are stored and scored per version ("eval" in the summary) but never learned
//          from, and the run ends once the last evaluation is in.
// Messages in:  (plan_atom, actor sampler, vector<actor> evaluators) -> std::string summary JSON; (record_atom, ScoredRollout);
//               (record_atom, Telemetry) (kept in the store);
//               (stats_atom) -> Telemetry; down messages of the evaluators it watches
#pragma once

#include "core/config.hpp"
#include "experiment/adaptation.hpp"
#include "experiment/scores.hpp"
#include "messages/messages.hpp"

#include <caf/actor.hpp>

#include <map>
#include <string>
#include <vector>

namespace kernelrl {

struct SupervisorArgs {
  std::string run_id;                  // id of the run in the store
  std::string store_path;              // RUN_DIR/store.sqlite
  std::string synchronous = "normal";  // StoreConfig::synchronous
  Mode mode = Mode::eval;              // ExperimentConfig::mode
  std::string config_toml;             // resolved config, kept with the run
  std::vector<std::string> task_ids;   // tasks of the experiment, in order
  double join_wait_s = 0;              // cluster: how long to wait for an evaluator to join when
                                       // none is running (0: single node, fail at once)
  // train mode
  caf::actor learner;          // the learner actor
  caf::actor selector;         // checkpoint_selector (StepStats score its checkpoints)
  uint32_t steps = 0;          // [learner] steps
  uint32_t batch_size = 8;     // tasks per step
  uint32_t group_size = 8;     // samples per task per step
  uint32_t max_staleness = 0;  // [learner] max_staleness
  uint64_t seed = 0;           // task order
  bool resume = false;         // continue a run from its store and checkpoints
  uint32_t patience = 0;       // early stopping (AdaptationTracker), train and ttt
  // train: periodic evaluation on held-out tasks (empty: none). The versions evaluated: the first
  // one served, every eval_every-th, and the last; each with eval_samples samples per task.
  std::vector<std::string> eval_task_ids;
  uint32_t eval_every = 0;
  uint32_t eval_samples = 1;
  // What makes two runs' budgets comparable (K, temperature, max_tokens, eval mode, checkpoint),
  // written with the run's compute into RUN_DIR/compute.json.
  std::map<std::string, std::string> settings;
};

caf::actor spawn_supervisor(caf::actor_system& sys, SupervisorArgs args);

}  // namespace kernelrl

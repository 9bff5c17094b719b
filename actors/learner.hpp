// learner: GRPO on a LoRA adapter with streaming minibatches (the engine is learner/lora_learner,
// behind a torch-free interface). Runs detached: forward/backward blocks its own thread only.
//
// A group (the samples of one task in one step) is learned from as soon as its last sample
// arrives (the supervisor's experiment decides when a group is complete and says so), while other groups are still being sampled and evaluated; the optimizer steps
// once every group the supervisor planned for the step is in. One step, one policy version: the
// new adapter is saved as RUN_DIR/checkpoints/step-V (V the new version), announced to the
// checkpoint_selector, and published to every sampler as WeightsUpdate(V). The step's answer goes
// to the supervisor only when every sampler has acknowledged V; a sampler that refuses or does
// not answer within sync_timeout_s makes the answer an error (the run stops; nothing samples
// with stale weights unnoticed); a sampler that has gone away (the learner watches each) is
// dropped from the set and from any version on its way (the supervisor plans its work
// elsewhere; with none left the version is still saved, and one that joins starts from it).
// SDPO: the group's teacher prompts are made here (learner/sdpo.hpp) and scored by the engine;
// the step's teacher tokens are reported with its stats (teacher_tokens).
// Interface: learner_actor (messages/interfaces.hpp).
// Messages in:  (sync_atom, vector<actor> samplers) -> uint64_t version: the samplers to serve
//               from now on; publishes the current weights to them, answered once acked;
//               (sync_atom, actor sampler, std::string name) -> uint64_t version: a sampler that
//               joined (another node): the current weights are published to it, answered once
//               acked; it gets every later version too;
//               (plan_atom, uint32_t step, uint64_t groups) -> StepUpdate: answered when that
//               step's update is done and acknowledged (error set on failure);
//               (train_atom, ScoredRollout, bool last): a sample the supervisor accepted; `last`:
//               its group is complete;
//               (stats_atom) -> Telemetry
// Messages out: WeightsUpdate -> samplers; Checkpoint -> checkpoint_selector
#pragma once

#include "messages/interfaces.hpp"

#include <caf/actor.hpp>

#include "learner/sdpo.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kernelrl {

class LearnerEngine;

struct LearnerArgs {
  std::shared_ptr<LearnerEngine> engine;  // null: every step request is refused with an error
  selector_actor selector;                // checkpoint_selector (may be invalid)
  std::string checkpoint_dir;             // RUN_DIR/checkpoints
  double sync_timeout_s = 300;            // per WeightsUpdate acknowledgement
  // SDPO (the engine's objective is "sdpo"): each sample's teacher prompt is
  // teacher_prompt(task_id, section) for its section from teacher_sections(group, sdpo); every
  // sample's teacher context and figures are appended to teacher_log (JSONL) for audit.
  bool sdpo_enabled = false;
  SdpoConfig sdpo;  // [sdpo] as the config's reader made it
  std::function<std::string(const std::string& task_id, const std::string& section)> teacher_prompt;
  std::string teacher_log;  // RUN_DIR/teacher.jsonl
  // Profiling rejection sampling: a correct sample whose own kernels were measured to cover less
  // than reject_coverage_below of the GPU time (kernel_coverage, GPU evaluations only) leaves its
  // group before the group is learned from, unless a draw keeps it (reject_keep_probability, by a
  // hash of its sample id and reject_seed); counted per step (coverage_rejected). 0: off.
  double reject_coverage_below = 0;
  double reject_keep_probability = 0;
  uint64_t reject_seed = 0;
};

// Whether profiling rejection sampling (LearnerArgs::reject_coverage_below) takes `s` out of its group.
bool rejected_for_coverage(const ScoredRollout& s, double below, double keep_probability, uint64_t seed);

learner_actor spawn_learner(caf::actor_system& sys, LearnerArgs args);

}  // namespace kernelrl

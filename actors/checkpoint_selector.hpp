// checkpoint_selector: keeps the learner's checkpoints (RUN_DIR/checkpoints/step-N, PEFT format,
// written by the learner) with the StepStats of the step each one sampled, and answers "best so
// far" (Best-of-Adaptation). Checkpoint step-N holds policy version N, the weights that sampled
// step N, so its score is step N's fast_1. It writes each StepStats as step-N/stats.json and keeps
// step 0, the newest `keep_last`, the best by fast_1 (the earlier step on a tie) and any not yet
// scored, and any pinned; the others are deleted. At start it reads what an earlier run left in
// the folder.
// Interface: selector_actor (messages/interfaces.hpp)
// Messages in:  Checkpoint (a new checkpoint, score not known yet);
//               (record_atom, StepStats) (the score of checkpoint step-N);
//               (keep_atom, uint32_t step) (pin step-N: a version the held-out evaluation scores);
//               (best_atom) -> Checkpoint, or an error when none is scored
#pragma once

#include "messages/interfaces.hpp"

#include <caf/fwd.hpp>

#include <cstdint>
#include <string>

namespace kernelrl {

struct SelectorArgs {
  std::string dir;         // RUN_DIR/checkpoints ("": keep nothing on disk, only answer best)
  uint32_t keep_last = 3;  // newest checkpoints kept besides step 0 and the best (0: all)
};

selector_actor spawn_checkpoint_selector(caf::actor_system& sys, SelectorArgs args);

}  // namespace kernelrl

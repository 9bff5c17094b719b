// checkpoint_selector: keeps the checkpoints announced by the learner with their scores and
// answers "best so far" (Best-of-Adaptation). Writing adapters to disk arrives with the learner.
// Messages in:  Checkpoint; (best_atom) -> Checkpoint, or an error when none was announced
#pragma once

#include <caf/fwd.hpp>

namespace kernelrl {

caf::actor spawn_checkpoint_selector(caf::actor_system& sys);

}  // namespace kernelrl

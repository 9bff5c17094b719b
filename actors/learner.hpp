// learner: the message interface of the GRPO/SFT learner. In this build it accepts scored
// samples and counts them; it performs no update and publishes no weights (issue 6 brings the
// LibTorch learner). A request to take a step is refused with an error, never faked.
// Messages in:  (train_atom, ScoredRollout); (train_atom, uint32_t step) -> error;
//               (stats_atom) -> Telemetry
// Messages out: WeightsUpdate -> samplers, Checkpoint -> checkpoint_selector (issue 6)
#pragma once

#include <caf/fwd.hpp>

#include <cstdint>

namespace kernelrl {

caf::actor spawn_learner(caf::actor_system& sys);

}  // namespace kernelrl

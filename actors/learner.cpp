#include "actors/learner.hpp"

#include "core/paths.hpp"
#include "messages/messages.hpp"

#include <caf/all.hpp>

namespace kernelrl {

namespace {

struct learner_state {
  uint64_t received = 0;
  static inline const char* name = "learner";
};

caf::behavior learner_actor(caf::stateful_actor<learner_state>* self) {
  return {
      [=](train_atom, const ScoredRollout&) { ++self->state.received; },
      [=](train_atom, uint32_t step) -> caf::result<uint64_t> {
        return caf::make_error(caf::sec::feature_disabled,
                               "learner: no policy update is implemented in this build (step " +
                                   std::to_string(step) + ")");
      },
      [=](stats_atom) {
        Telemetry t;
        t.ts = now_s();
        t.source = "learner";
        t.values = {{"samples_received", double(self->state.received)}, {"updates", 0.0}};
        return t;
      },
  };
}

}  // namespace

caf::actor spawn_learner(caf::actor_system& sys) { return sys.spawn(learner_actor); }

}  // namespace kernelrl

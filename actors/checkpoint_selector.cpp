#include "actors/checkpoint_selector.hpp"

#include "messages/messages.hpp"

#include <caf/all.hpp>

#include <vector>

namespace kernelrl {

namespace {

struct selector_state {
  std::vector<Checkpoint> checkpoints;
  static inline const char* name = "checkpoint_selector";
};

caf::behavior selector_actor(caf::stateful_actor<selector_state>* self) {
  return {
      [=](Checkpoint& c) { self->state.checkpoints.push_back(std::move(c)); },
      [=](best_atom) -> caf::result<Checkpoint> {
        const auto& cs = self->state.checkpoints;
        if (cs.empty())
          return caf::make_error(caf::sec::runtime_error, "checkpoint_selector: no checkpoint yet");
        const Checkpoint* best = &cs.front();
        // Highest score; the earliest step wins a tie (fewer adaptation steps).
        for (auto& c : cs)
          if (c.score > best->score || (c.score == best->score && c.step < best->step)) best = &c;
        return *best;
      },
  };
}

}  // namespace

caf::actor spawn_checkpoint_selector(caf::actor_system& sys) { return sys.spawn(selector_actor); }

}  // namespace kernelrl

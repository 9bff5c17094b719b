// The learner of a learning run and its checkpoint selector, made where the learner role is: in
// the head's process, or on the learner node (`launch CONFIG --node NAME`), which writes the run's
// checkpoints under the run directory the head names.
#pragma once

#include "core/config.hpp"

#include "messages/interfaces.hpp"

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <map>
#include <memory>
#include <string>

namespace kernelrl {

class LearnerEngine;

// A learning run's model and adapter (resume: the newest whole checkpoint under
// RUN_DIR/checkpoints, optimizer included); throws when they do not load.
std::shared_ptr<LearnerEngine> make_engine(const Config& cfg, const std::string& run_dir, bool resume);

struct LearningActors {
  learner_actor learner;
  selector_actor selector;
};

// The checkpoint selector of RUN_DIR/checkpoints and the learner around `engine`; SDPO's teacher
// prompts from user_messages (by task: what the student was asked).
LearningActors spawn_learning(caf::actor_system& sys, const Config& cfg,
                              const std::map<std::string, std::string>& user_messages, const std::string& run_dir,
                              std::shared_ptr<LearnerEngine> engine);

}  // namespace kernelrl

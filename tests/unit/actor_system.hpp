// An actor system for one test: kernelrl's message types registered, CAF's logger quiet.
#pragma once

#include "messages/messages.hpp"

#include <caf/all.hpp>

#include <memory>

namespace kernelrl::test {

struct System {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  System() {
    add_message_types(cfg);
    cfg.set("logger.verbosity", caf::atom("quiet"));
    sys = std::make_unique<caf::actor_system>(cfg);
  }
};

}  // namespace kernelrl::test

// What an untyped actor does with a message none of its handlers takes: a warning in its
// component's log naming the sender's node and the message, and an unexpected_message error to a
// sender that asked (CAF's own default prints to the terminal, outside the run's log).
#pragma once

#include "core/log.hpp"

#include <caf/all.hpp>

#include <string>

namespace kernelrl {

inline void log_unexpected_messages(caf::scheduled_actor* self, const std::string& component) {
  auto lg = log::get(component);
  self->set_default_handler([lg](caf::scheduled_actor* s, caf::message_view& m) -> caf::result<caf::message> {
    auto sender = s->current_sender();
    lg->warn("dropped an unexpected message from {}: {}",
             sender ? caf::to_string(sender->node()) : std::string("an anonymous sender"), m.content().stringify());
    return caf::sec::unexpected_message;
  });
}

}  // namespace kernelrl

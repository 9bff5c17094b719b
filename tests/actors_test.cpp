// The learner and checkpoint-selector actors as far as this build defines them: the learner takes
// samples but refuses to claim an update; the selector answers the best checkpoint so far.
#include "actors/checkpoint_selector.hpp"
#include "actors/learner.hpp"
#include "messages/messages.hpp"

#include <caf/all.hpp>
#include <catch2/catch.hpp>

using namespace kernelrl;

namespace {
struct System {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  System() {
    add_message_types(cfg);
    cfg.set("logger.verbosity", caf::atom("quiet"));
    sys = std::make_unique<caf::actor_system>(cfg);
  }
};
}  // namespace

TEST_CASE("the learner counts samples and refuses to take a step", "[actors]") {
  System s;
  auto learner = spawn_learner(*s.sys);
  caf::scoped_actor self{*s.sys};
  self->send(learner, train_atom::value, ScoredRollout{});
  self->send(learner, train_atom::value, ScoredRollout{});
  bool refused = false;
  self->request(learner, std::chrono::seconds(5), train_atom::value, uint32_t{1})
      .receive([](uint64_t) {}, [&](caf::error& e) {
        refused = true;
        CHECK(s.sys->render(e).find("no policy update is implemented") != std::string::npos);
      });
  CHECK(refused);
  self->request(learner, std::chrono::seconds(5), stats_atom::value)
      .receive([](Telemetry& t) {
                 CHECK(t.values["samples_received"] == 2);
                 CHECK(t.values["updates"] == 0);
               },
               [](caf::error&) { FAIL("no stats"); });
  self->send_exit(learner, caf::exit_reason::user_shutdown);
}

TEST_CASE("the checkpoint selector answers the best score, the earliest step on a tie", "[actors]") {
  System s;
  auto sel = spawn_checkpoint_selector(*s.sys);
  caf::scoped_actor self{*s.sys};
  bool none = false;
  self->request(sel, std::chrono::seconds(5), best_atom::value)
      .receive([](Checkpoint&) {}, [&](caf::error&) { none = true; });
  CHECK(none);
  self->send(sel, Checkpoint{3, 3, "step-3", 0.5});
  self->send(sel, Checkpoint{1, 1, "step-1", 0.25});
  self->send(sel, Checkpoint{2, 2, "step-2", 0.5});
  self->send(sel, Checkpoint{4, 4, "step-4", 0.125});
  self->request(sel, std::chrono::seconds(5), best_atom::value)
      .receive([](Checkpoint& c) { CHECK(c.path == "step-2"); },
               [](caf::error&) { FAIL("no best checkpoint"); });
  self->send_exit(sel, caf::exit_reason::user_shutdown);
}

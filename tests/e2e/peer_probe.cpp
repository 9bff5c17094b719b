// peer_probe: a deliberately misbehaving peer for the cluster tests. It reaches a head's gate
// through CAF's middleman like a node, but lets the test choose what it claims and what it
// skips, to check that the gate refuses each with a clear message:
//   peer_probe HOST PORT [--name N] [--cluster NAME] [--protocol N] [--secret S] [--no-join] ACTION
// ACTION: join (hello, challenge, join), register (register an actor as an evaluator), learner
// (ask for the run directory, then register an actor as the run's learner), monitor (the same
// for the run's monitor), stats (ask for telemetry). Prints one line per answer: "ok ..." or "refused: <the head's error>".
// Exit 0 when every step was accepted, 3 when one was refused, 1 when the head is unreachable.
#include "core/auth.hpp"
#include "messages/messages.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <cstdio>
#include <string>

using namespace kernelrl;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: peer_probe HOST PORT [--name N] [--cluster NAME] [--protocol N] "
                 "[--secret S] [--no-join] join|register|learner|monitor|stats\n");
    return 2;
  }
  std::string host = argv[1], name = "probe", cluster, secret, action;
  auto port = static_cast<uint16_t>(std::stoul(argv[2]));
  uint32_t protocol = protocol_version;
  bool join = true;
  for (int i = 3; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--no-join")
      join = false;
    else if (a == "--name" && i + 1 < argc)
      name = argv[++i];
    else if (a == "--cluster" && i + 1 < argc)
      cluster = argv[++i];
    else if (a == "--protocol" && i + 1 < argc)
      protocol = static_cast<uint32_t>(std::stoul(argv[++i]));
    else if (a == "--secret" && i + 1 < argc)
      secret = argv[++i];
    else
      action = a;
  }
  caf::actor_system_config cfg;
  add_message_types(cfg);
  cfg.load<caf::io::middleman>();
  cfg.set("logger.verbosity", caf::atom("quiet"));
  caf::actor_system sys{cfg};
  auto gate = sys.middleman().remote_actor(host, port);
  if (!gate) {
    std::printf("unreachable: %s\n", sys.render(gate.error()).c_str());
    return 1;
  }
  caf::scoped_actor self{sys};
  int rc = 0;
  auto refused = [&](caf::error& e) {
    std::printf("refused: %s\n", error_text(sys, e).c_str());
    std::fflush(stdout);
    rc = 3;
  };
  auto t = std::chrono::seconds(10);
  self->request(*gate, t, hello_atom::value)
      .receive(
          [&](std::vector<std::string>& h) {
            std::printf("ok hello: cluster %s, protocol %s\n", h.at(0).c_str(), h.at(1).c_str());
          },
          refused);
  if (cluster.empty()) cluster = "?";
  if (join && rc == 0) {
    std::string nonce;
    self->request(*gate, t, challenge_atom::value, random_nonce())
        .receive([&](std::vector<std::string>& r) { nonce = r.at(0); }, refused);
    if (rc == 0)
      self->request(*gate, t, join_atom::value, name, cluster, protocol,
                    join_proof(secret, nonce, name, cluster, protocol))
          .receive([&](bool) { std::printf("ok joined\n"); }, refused);
  }
  if (rc == 0 && action == "register") {
    auto dummy = sys.spawn([]() -> caf::behavior { return {[](eval_atom, EvalRequest&) { return EvalResult{}; }}; });
    self->send(*gate, register_atom::value, dummy, name + "/probe-0");
    // The gate answers nothing to a registration: ask something after it, so the test knows it
    // was processed, and read the outcome from the head's log.
    self->request(*gate, t, hello_atom::value)
        .receive([&](std::vector<std::string>&) { std::printf("ok sent register\n"); }, refused);
    anon_send_exit(dummy, caf::exit_reason::user_shutdown);
  }
  if (rc == 0 && action == "learner") {  // claims the run's learner: asks where it goes, then registers one
    self->request(*gate, t, learner_atom::value)
        .receive([&](std::string& dir, bool) { std::printf("ok learner run dir %s\n", dir.c_str()); }, refused);
    auto dummy = sys.spawn([]() -> caf::behavior { return {[](stats_atom) { return uint64_t(0); }}; });
    self->request(*gate, t, register_atom::value, learner_atom::value, dummy, caf::actor{})
        .receive([&](bool) { std::printf("ok learner registered\n"); }, refused);
    anon_send_exit(dummy, caf::exit_reason::user_shutdown);
  }
  if (rc == 0 && action == "monitor") {  // claims the run's monitor: asks where it goes, then registers one
    self->request(*gate, t, monitor_atom::value)
        .receive([&](std::string& dir, caf::actor&) { std::printf("ok monitor run dir %s\n", dir.c_str()); }, refused);
    auto dummy = sys.spawn([]() -> caf::behavior { return {[](stats_atom) { return uint64_t(0); }}; });
    self->request(*gate, t, register_atom::value, monitor_atom::value, dummy)
        .receive([&](bool) { std::printf("ok monitor registered\n"); }, refused);
    anon_send_exit(dummy, caf::exit_reason::user_shutdown);
  }
  if (rc == 0 && action == "stats")
    self->request(*gate, t, stats_atom::value)
        .receive([&](Telemetry& tm) { std::printf("ok stats: %zu values\n", tm.values.size()); }, refused);
  std::fflush(stdout);
  return rc;
}

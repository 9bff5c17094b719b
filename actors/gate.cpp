#include "actors/gate.hpp"
#include "actors/unexpected.hpp"

#include "core/auth.hpp"
#include "core/log.hpp"
#include "messages/messages.hpp"

#include <caf/all.hpp>

#include <map>

namespace kernelrl {

namespace {

struct gate_state {
  std::map<caf::node_id, std::string> nonces;               // one outstanding challenge per peer
  std::map<caf::node_id, std::string> joined;               // peer -> node name
  std::map<caf::actor_addr, caf::node_id> joiners;          // the actor that joined, watched: its
                                                            // connection dropping ends the membership
  std::map<caf::actor_addr, std::string> samplers;          // samplers registered by joined nodes
  bool learner = false;                                     // the learner node's learner registered
  monitor_actor monitor;                                    // the head's, or the monitor node's once registered
  std::vector<std::pair<caf::actor, std::string>> sources;  // telemetry sources registered from nodes
  uint64_t refused = 0;
  static inline const char* name = "gate";
};

using self_ptr = gate_actor::stateful_pointer<gate_state>;

caf::error refuse(self_ptr self, const std::string& peer, const std::string& why) {
  ++self->state.refused;
  log::get("gate")->warn("peer {} refused: {}", peer, why);
  return caf::make_error(caf::sec::runtime_error, "refused by the head: " + why);
}

// The current message comes from a sampler a joined node registered.
bool from_registered_sampler(self_ptr self) {
  auto sender = self->current_sender();
  return sender && self->state.samplers.count(sender->address()) > 0;
}

// A peer that has proven the secret, or this process.
bool trusted(self_ptr self) {
  auto sender = self->current_sender();
  if (!sender) return false;
  return sender->node() == self->node() || self->state.joined.count(sender->node()) > 0;
}

// The name of the joined peer that sent the current message, if it is the node named `owner` that
// runs this run's `role` (learner, monitor; "" owner: the head runs it).
caf::expected<std::string> role_peer(self_ptr self, const std::string& owner, const std::string& role) {
  auto sender = self->current_sender();
  if (!trusted(self) || !sender)
    return refuse(self, "(not joined)", "the " + role + " comes from a peer that has joined");
  auto j = self->state.joined.find(sender->node());
  const std::string node = j == self->state.joined.end() ? std::string() : j->second;
  if (owner.empty() || node != owner)
    return refuse(self, "\"" + node + "\"",
                  owner.empty() ? "this run's " + role + " runs on the head"
                                : "this run's " + role + " is node \"" + owner + "\"'s");
  return node;
}

// A telemetry source from a node: to the monitor now, and to a monitor that registers later.
void add_source(self_ptr self, const caf::actor& src, const std::string& id) {
  self->state.sources.emplace_back(src, id);
  if (self->state.monitor) self->send(self->state.monitor, register_atom::value, src, id);
}

// A watched actor is gone: the monitor node's monitor, or one of a peer's actors (the peer leaves
// with its last).
void member_gone(self_ptr self, const GateArgs& args, caf::down_msg& dm) {
  auto lg = log::get("gate");
  auto& st = self->state;
  if (st.monitor && dm.source == st.monitor.address()) {
    lg->warn("the monitor of node \"{}\" is gone ({}); the run goes on without its telemetry", args.monitor_node,
             caf::to_string(dm.reason));
    st.monitor = monitor_actor{};
    return;
  }
  auto it = st.joiners.find(dm.source);
  if (it == st.joiners.end()) return;
  auto nid = it->second;
  st.joiners.erase(it);
  for (auto& [addr, n] : st.joiners)
    if (n == nid) return;  // another of its actors still holds the membership
  auto j = st.joined.find(nid);
  if (j != st.joined.end()) {
    lg->info("peer \"{}\" left", j->second);
    st.joined.erase(j);
  }
}

// A peer's join: same protocol, same cluster, a challenge answered with the secret, a name of its own.
caf::result<bool> join(self_ptr self, const GateArgs& args, const std::string& node, const std::string& cluster,
                       uint32_t protocol, const std::string& proof) {
  auto lg = log::get("gate");
  auto sender = self->current_sender();
  if (!sender) return refuse(self, "(anonymous)", "no sender");
  auto nid = sender->node();
  std::string peer = "\"" + node + "\" (" + caf::to_string(nid) + ")";
  if (protocol != protocol_version)
    return refuse(self, peer,
                  "protocol version mismatch: the head runs protocol " + std::to_string(protocol_version) +
                      ", node \"" + node + "\" runs " + std::to_string(protocol) +
                      "; run the same kernelrl build on every node");
  if (cluster != args.cluster)
    return refuse(self, peer, "this is cluster \"" + args.cluster + "\", not \"" + cluster + "\"");
  auto it = self->state.nonces.find(nid);
  if (it == self->state.nonces.end()) return refuse(self, peer, "join without a challenge");
  std::string nonce = std::move(it->second);
  self->state.nonces.erase(it);
  if (!proofs_equal(proof, join_proof(args.secret, nonce, node, cluster, protocol)))
    return refuse(self, peer, "authentication failed (wrong cluster secret)");
  for (auto& [other, other_name] : self->state.joined)
    if (other_name == node && other != nid)
      return refuse(self, peer, "a peer named \"" + node + "\" has already joined; give each machine its own name");
  self->state.joined[nid] = node;
  self->state.joiners[sender->address()] = nid;
  self->monitor(caf::actor_cast<caf::actor_addr>(sender));
  lg->info("peer \"{}\" joined", node);
  return true;
}

// The learner node's learner and selector, its own, registered once.
caf::result<bool> register_learner(self_ptr self, const GateArgs& args, const join_listener& supervisor,
                                   const caf::actor& l, const caf::actor& sel) {
  auto lg = log::get("gate");
  auto found = role_peer(self, args.learner_node, "learner");
  if (!found) return std::move(found.error());
  const std::string node = *found;
  auto sender = self->current_sender();
  if (!l || l.node() != sender->node() || (sel && sel.node() != sender->node()))
    return refuse(self, "\"" + node + "\"", "a node registers its own learner only");
  if (self->state.learner) return refuse(self, "\"" + node + "\"", "this run's learner is registered already");
  self->state.learner = true;
  lg->info("the learner of node \"{}\" registered", node);
  if (supervisor) caf::anon_send(supervisor, register_atom::value, learner_atom::value, l, sel, node);
  add_source(self, l, "learner");
  return true;
}

// A joined node's sampler: its own actor, registered once, named sampler-NODE-i, rendering the
// prompts as the head does.
caf::result<bool> register_sampler(self_ptr self, const GateArgs& args, const join_listener& supervisor,
                                   const caf::actor& s, const std::string& id, const std::string& digest) {
  auto sender = self->current_sender();
  if (!trusted(self) || !sender) return refuse(self, "(not joined)", "samplers come from peers that have joined");
  auto j = self->state.joined.find(sender->node());
  const std::string node = j == self->state.joined.end() ? std::string() : j->second;
  if (!s || s.node() != sender->node())
    return refuse(self, "\"" + node + "\"", "sampler " + id + ": a node registers its own samplers only");
  if (node.empty() || id.rfind("sampler-" + node + "-", 0) != 0)
    return refuse(self, "\"" + node + "\"",
                  "sampler \"" + id + "\": the samplers of node \"" + node + "\" are named sampler-" + node + "-N");
  if (!args.prompts_digest.empty() && digest != args.prompts_digest)
    return refuse(self, "\"" + node + "\"",
                  "sampler " + id + ": node \"" + node +
                      "\" renders the tasks' prompts differently from the head (prompt digest " + digest.substr(0, 12) +
                      " against " + args.prompts_digest.substr(0, 12) +
                      "): give every node the same config, task files and model tokenizer");
  if (!self->state.samplers.emplace(s.address(), id).second)
    return refuse(self, "\"" + node + "\"", "sampler " + id + " is registered already");
  if (supervisor) caf::anon_send(supervisor, register_atom::value, sampler_atom::value, s, id);
  add_source(self, s, id);
  return true;
}

// The monitor node's monitor, its own, registered once; it gets every source of the run.
caf::result<bool> register_monitor(self_ptr self, const GateArgs& args, const caf::actor& m) {
  auto lg = log::get("gate");
  auto found = role_peer(self, args.monitor_node, "monitor");
  if (!found) return std::move(found.error());
  auto sender = self->current_sender();
  if (!m || m.node() != sender->node())
    return refuse(self, "\"" + *found + "\"", "a node registers its own monitor only");
  if (self->state.monitor) return refuse(self, "\"" + *found + "\"", "this run's monitor is registered already");
  auto typed = caf::actor_cast<monitor_actor>(m);  // a remote handle travels as caf::actor
  self->state.monitor = typed;
  self->monitor(typed);
  for (auto& [src, id] : args.sources) self->send(typed, register_atom::value, src, id);
  for (auto& [src, id] : self->state.sources) self->send(typed, register_atom::value, src, id);
  lg->info("the monitor of node \"{}\" registered", *found);
  return true;
}

gate_actor::behavior_type gate_behavior(self_ptr self, GateArgs args, dispatcher_actor dispatcher,
                                        join_listener supervisor, monitor_actor monitor) {
  auto lg = log::get("gate");
  self->state.monitor = monitor;
  self->set_down_handler([=](caf::down_msg& dm) { member_gone(self, args, dm); });
  log_unexpected_messages(self, "gate");
  return {
      [=](challenge_atom, const std::string& peer_nonce) -> caf::result<std::vector<std::string>> {
        auto sender = self->current_sender();
        if (!sender) return caf::make_error(caf::sec::runtime_error, "anonymous challenge");
        if (peer_nonce.size() < 32) return caf::make_error(caf::sec::runtime_error, "a challenge needs a nonce");
        auto nonce = random_nonce();
        self->state.nonces[sender->node()] = nonce;
        // The head proves the secret first: a peer joins only a head that holds it.
        return std::vector<std::string>{nonce,
                                        head_proof(args.secret, peer_nonce, nonce, args.cluster, protocol_version)};
      },
      [=](join_atom, const std::string& node, const std::string& cluster, uint32_t protocol, const std::string& proof) {
        return join(self, args, node, cluster, protocol, proof);
      },
      [=](hello_atom) -> std::vector<std::string> {
        return {args.cluster, std::to_string(protocol_version)};
      },
      [=](stats_atom) -> caf::result<Telemetry> {
        if (!trusted(self)) return refuse(self, "(not joined)", "telemetry is for peers that have joined");
        if (!self->state.monitor)
          return caf::make_error(caf::sec::runtime_error,
                                 args.monitor_node.empty()
                                     ? std::string("this head runs no monitor")
                                     : "the monitor runs on node \"" + args.monitor_node + "\", which has not joined");
        auto rp = self->make_response_promise<Telemetry>();
        self->request(self->state.monitor, std::chrono::seconds(5), stats_atom::value)
            .then([=](Telemetry& t) mutable { rp.deliver(std::move(t)); },
                  [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [=](register_atom, caf::actor ev, std::string id) {
        if (!trusted(self)) {
          ++self->state.refused;
          lg->warn("evaluator {} from a peer that has not joined: dropped", id);
          return;
        }
        self->send(dispatcher, register_atom::value, ev, id);
        if (supervisor) caf::anon_send(supervisor, register_atom::value, ev, id);
      },
      // A joined node's samplers send their rollouts here: the gate passes each on to the
      // dispatcher (which takes rollouts from this process only) and relays its answer, so the
      // dispatcher's backpressure reaches them. Only registered samplers may.
      [=](Rollout& r) -> caf::result<bool> {
        if (!from_registered_sampler(self))
          return refuse(self, "(not a registered sampler)", "rollouts come from registered samplers only");
        auto rp = self->make_response_promise<bool>();
        self->request(dispatcher, caf::infinite, std::move(r))
            .then([=](bool ok) mutable { rp.deliver(ok); }, [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [=](skip_atom, Rollout& r, std::string& why) {
        if (!from_registered_sampler(self)) {
          ++self->state.refused;
          lg->warn("a skipped rollout from an actor that is not a registered sampler: dropped");
          return;
        }
        self->send(dispatcher, skip_atom::value, std::move(r), std::move(why));
      },
      // The learner node: where the run's checkpoints go, then its learner and selector.
      [=](learner_atom) -> caf::result<std::string, bool> {
        auto node = role_peer(self, args.learner_node, "learner");
        if (!node) return std::move(node.error());
        return {args.run_dir, args.resume};
      },
      [=](register_atom, learner_atom, caf::actor l, caf::actor sel) {
        return register_learner(self, args, supervisor, l, sel);
      },
      // A joined node's sampler: its own actor, registered once, named sampler-NODE-i.
      [=](register_atom, sampler_atom, caf::actor s, const std::string& id, const std::string& digest) {
        return register_sampler(self, args, supervisor, s, id, digest);
      },
      // The monitor node: where its metrics.jsonl goes and who stores its snapshots; then its
      // monitor, which gets every source of the run.
      [=](monitor_atom) -> caf::result<std::string, caf::actor> {
        auto node = role_peer(self, args.monitor_node, "monitor");
        if (!node) return std::move(node.error());
        return {args.run_dir, args.recorder};
      },
      [=](register_atom, monitor_atom, caf::actor m) { return register_monitor(self, args, m); },
      // The run's end (this process only): the monitor's last snapshot, wherever it runs.
      [=](finish_atom) -> caf::result<bool> {
        auto sender = self->current_sender();
        if (!sender || sender->node() != self->node())
          return refuse(self, "(another process)", "the run's end is the head's to call");
        if (!self->state.monitor) return false;
        auto rp = self->make_response_promise<bool>();
        self->request(self->state.monitor, std::chrono::seconds(10), finish_atom::value)
            .then([=](bool b) mutable { rp.deliver(b); }, [=](caf::error&) mutable { rp.deliver(false); });
        return rp;
      },
  };
}

}  // namespace

gate_actor spawn_gate(caf::actor_system& sys, GateArgs args, dispatcher_actor dispatcher, join_listener supervisor,
                      monitor_actor monitor) {
  return sys.spawn(gate_behavior, std::move(args), std::move(dispatcher), std::move(supervisor), std::move(monitor));
}

}  // namespace kernelrl

// gate: the head's published door, the only actor a peer can reach before it has proven the
// cluster secret. A node sends a nonce and gets one (challenge_atom) with the head's own proof of
// the secret, which it checks before anything else; it answers with its HMAC proof
// (join_atom; core/auth.hpp), and only then may register its evaluators, which the gate
// forwards to the dispatcher and the supervisor, and its samplers, which go to the supervisor
// and the monitor. Messages from peers that have not joined, a
// wrong proof, another cluster's name or another protocol version are refused with a clear
// error to the peer and a warning in the log; the secret never appears in either.
// A peer stays a member while the actor that joined is reachable; when its connection drops
// (the process ended, or the link was silent past peer_timeout_s) it must join again.
// Messages in (its interface, gate_actor in messages/interfaces.hpp):
//               (hello_atom) -> [cluster name, protocol version] (anyone: nothing secret);
//               (challenge_atom, peer nonce) -> [nonce, the head's proof of the secret];
//               (join_atom, node, cluster, protocol, proof) -> bool;
//               (register_atom, actor, std::string id) from a joined node or this process;
//               (register_atom, sampler_atom, actor, id, prompts digest) -> bool: a joined
//               node's sampler is running (its own actor, once, named sampler-NODE-i, its node
//               rendering the head's prompts; else refused);
//               Rollout -> bool and (skip_atom, Rollout, why) from registered samplers only;
//               (learner_atom) -> (run_dir, resume) and (register_atom, learner_atom, learner,
//               selector) -> bool: from the joined node named learner_node only, its own actors,
//               once;
//               (monitor_atom) -> (run_dir, recorder) and (register_atom, monitor_atom, monitor)
//               -> bool: from the joined node named monitor_node only, its own actor; the gate
//               then registers every telemetry source with it (and each one registered later);
//               (stats_atom) -> Telemetry, the monitor's latest snapshot, for joined peers
//               (`launch monitor HOST:PORT`);
//               (finish_atom) -> bool from this process: the monitor's last snapshot (false
//               when no monitor is registered)
// Messages out: (register_atom, actor, id) -> dispatcher and supervisor (an evaluator);
//               (register_atom, sampler_atom, actor, id) -> supervisor and (register_atom, actor,
//               id) -> monitor (a sampler); (register_atom, learner_atom, learner, selector,
//               node) -> supervisor and (register_atom, learner, "learner") -> monitor (the learner
//               node's); Rollout (a request, its answer relayed) and
//               (skip_atom, Rollout, why) -> dispatcher
#pragma once

#include "messages/interfaces.hpp"

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <string>
#include <utility>
#include <vector>

namespace kernelrl {

struct GateArgs {
  std::string cluster;       // [cluster] name; a node naming another is refused
  std::string secret;        // the cluster secret (never logged)
  std::string learner_node;  // the node whose learner this run waits for ("": the head's own)
  std::string run_dir;       // told to that node: where the run's checkpoints go
  bool resume = false;       // ... and whether it resumes from the newest of them
  std::string monitor_node;  // the node whose monitor this run takes ("": the head's own)
  caf::actor recorder;       // ... told to it: where its snapshots are stored (the supervisor)
  std::vector<std::pair<caf::actor, std::string>> sources;  // ... and what it watches (this process's)
  std::string prompts_digest;  // the head's rendered prompts (wiring/inputs.hpp); a sampler node's must match
};

// `monitor` answers (stats_atom) with the merged snapshot; may be invalid (then a monitor node's
// registers later).
gate_actor spawn_gate(caf::actor_system& sys, GateArgs args, dispatcher_actor dispatcher, join_listener supervisor,
                      monitor_actor monitor);

}  // namespace kernelrl

// The actors' typed interfaces: what each accepts and answers, declared in one place beside the
// messages, so a message a receiver cannot handle does not compile (CAF typed actors): every
// actor's, `launch serve`'s front (a typed CAF broker) included; the parts several share
// (telemetry_source, final_snapshot, the recorders, join_listener) declared once. A typed handle in
// a message or crossing nodes travels as caf::actor (the gate's register messages, the
// supervisor's plan, the learner's sync: as_actors) and is cast back on arrival (as_typed).
#pragma once

#include "messages/messages.hpp"

#include <caf/actor.hpp>
#include <caf/actor_cast.hpp>
#include <caf/io/connection_handle.hpp>
#include <caf/io/system_messages.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kernelrl {

// What the monitor asks each of its sources every tick: the source's telemetry.
using telemetry_source = caf::typed_actor<caf::replies_to<stats_atom>::with<Telemetry>>;

// What ends a run's telemetry: a last round of answers and the final line, answered once written
// (this process's monitor, or the gate, which passes it to a monitor node's).
using final_snapshot = caf::typed_actor<caf::replies_to<finish_atom>::with<bool>>;

// evaluator (actors/evaluator.hpp): a request's verdict; a queued request not yet started given
// back (its request then answers the error withdrawn_error).
using evaluator_actor = caf::typed_actor<caf::replies_to<eval_atom, EvalRequest>::with<EvalResult>,
                                         caf::reacts_to<withdraw_atom, std::string>>;

// Where a sampler's rollouts go: the dispatcher, or on a sampler node the head's gate, which
// passes them on to it (a remote handle, cast to this on arrival). A rollout to evaluate is
// answered once it is queued and the queue has room (backpressure); a rollout not to evaluate is
// scored as skipped, with why.
using rollout_sink =
    caf::typed_actor<caf::replies_to<Rollout>::with<bool>, caf::reacts_to<skip_atom, Rollout, std::string>>;

// dispatcher (actors/dispatcher.hpp): rollouts; an evaluator registering (as caf::actor: it may
// come through the gate), with its id "node/device"; telemetry.
using dispatcher_actor =
    rollout_sink::extend<caf::reacts_to<register_atom, caf::actor, std::string>>::extend_with<telemetry_source>;

// sampler (actors/sampler.hpp): a step's plan of every task, answered with the rollouts it will
// send; a plan of some groups (the supervisor's share for it; a replay sampler refuses it); new
// weights, answered with the policy version it now serves (a replay sampler refuses them); its own
// timer (the next batch to generate); telemetry. A sampler on another node registers as caf::actor
// (through the gate) and is cast to this on arrival.
using sampler_actor =
    telemetry_source::extend<caf::replies_to<plan_atom, uint32_t>::with<uint64_t>,
                             caf::replies_to<SamplePlan>::with<uint64_t>,
                             caf::replies_to<WeightsUpdate>::with<uint64_t>, caf::reacts_to<tick_atom>>;

// learner (actors/learner.hpp): the samplers to serve (as caf::actor: they travel in the
// supervisor's message), answered with the policy version they took; a sampler that joined (from
// another node) and its name, likewise; a step's plan (its step and groups), answered with the
// step's update once every sampler took it; a sample the supervisor accepted and whether its group
// is complete; telemetry. A learner node's learner registers as caf::actor (through the gate) and
// is cast to this on arrival.
using learner_actor = telemetry_source::extend<caf::replies_to<sync_atom, std::vector<caf::actor>>::with<uint64_t>,
                                               caf::replies_to<sync_atom, caf::actor, std::string>::with<uint64_t>,
                                               caf::replies_to<plan_atom, uint32_t, uint64_t>::with<StepUpdate>,
                                               caf::reacts_to<train_atom, ScoredRollout, bool>>;

// reward (actors/reward.hpp): scores a verdict and sends the ScoredRollout to its recorder.
using reward_actor = caf::typed_actor<caf::reacts_to<score_atom, Rollout, EvalResult>>;

// checkpoint_selector (actors/checkpoint_selector.hpp): a new checkpoint; the score of step N;
// pin step N; the best scored so far.
using selector_actor =
    caf::typed_actor<caf::reacts_to<Checkpoint>, caf::reacts_to<record_atom, StepStats>,
                     caf::reacts_to<keep_atom, uint32_t>, caf::replies_to<best_atom>::with<Checkpoint>>;

// monitor (actors/monitor.hpp): its own timer (the next tick); one more telemetry source (as
// caf::actor, a sampler that joined through the gate) and its id; the latest merged snapshot; a
// last round of answers and the final line, answered once written. Its sources (supervisor,
// dispatcher, sampler, learner, ...) are held as telemetry_source; one that joined through the
// gate is cast to it on arrival.
using monitor_actor =
    telemetry_source::extend<caf::reacts_to<tick_atom>,
                             caf::reacts_to<register_atom, caf::actor, std::string>>::extend_with<final_snapshot>;

// gate (actors/gate.hpp): the head's published door. Before joining, anyone: (hello_atom) ->
// [cluster, protocol version]; (challenge_atom, nonce) -> [nonce, the head's proof]. Then (join_atom,
// node, cluster, protocol_version, proof) -> bool. Joined peers: an evaluator (register_atom, actor,
// id); a sampler's rollouts, as a rollout_sink; the learner node's (learner_atom) -> (run_dir,
// resume) and (register_atom, learner_atom, learner, selector) -> bool; a sampler (register_atom,
// sampler_atom, actor, id, prompts digest) -> bool; the monitor node's (monitor_atom) -> (run_dir,
// recorder) and (register_atom, monitor_atom, monitor) -> bool; the monitor's snapshot (stats_atom)
// -> Telemetry. This process: (finish_atom) -> bool. Peers reach it through a dynamically typed
// remote handle (the hello and join shapes never change, so a peer of any version gets a clear
// answer), and every handle in its messages is a caf::actor.
using gate_actor = rollout_sink::extend<
    caf::replies_to<hello_atom>::with<std::vector<std::string>>,
    caf::replies_to<challenge_atom, std::string>::with<std::vector<std::string>>,
    caf::replies_to<join_atom, std::string, std::string, uint32_t, std::string>::with<bool>,
    caf::reacts_to<register_atom, caf::actor, std::string>, caf::replies_to<learner_atom>::with<std::string, bool>,
    caf::replies_to<register_atom, learner_atom, caf::actor, caf::actor>::with<bool>,
    caf::replies_to<register_atom, sampler_atom, caf::actor, std::string, std::string>::with<bool>,
    caf::replies_to<monitor_atom>::with<std::string, caf::actor>,
    caf::replies_to<register_atom, monitor_atom, caf::actor>::with<bool>>::extend_with<telemetry_source,
                                                                                       final_snapshot>;

// Where the reward sends each scored sample: the supervisor, or `launch serve`'s recorder.
using score_recorder = caf::typed_actor<caf::reacts_to<record_atom, ScoredRollout>>;

// Where the monitor stores its snapshots: the supervisor (on a monitor node, the remote handle
// the gate gave, cast to this).
using telemetry_recorder = caf::typed_actor<caf::reacts_to<record_atom, Telemetry>>;

// `launch serve`'s recorder (actors/service.hpp), the store's one writer: scored samples (each
// answered to the front) and telemetry to record; the front to answer (as caf::actor, cast to
// service_front_actor); the service's summary at its end, answered once the run is closed in the
// store.
using service_recorder_actor =
    score_recorder::extend<caf::reacts_to<register_atom, caf::actor>,
                           caf::replies_to<finish_atom, std::string>::with<bool>>::extend_with<telemetry_recorder>;

// What the gate tells of the peers that joined: the supervisor, or under `launch serve` the
// service's front. An evaluator (actor, id "node/device"); a sampler (sampler_atom, actor, id); the
// learner node's learner and selector (learner_atom, learner, selector, node). Each handle as
// caf::actor (it came from another node).
using join_listener =
    caf::typed_actor<caf::reacts_to<register_atom, caf::actor, std::string>,
                     caf::reacts_to<register_atom, sampler_atom, caf::actor, std::string>,
                     caf::reacts_to<register_atom, learner_atom, caf::actor, caf::actor, std::string>>;

// supervisor (actors/supervisor.hpp): the run's plan (its samplers and evaluators, as caf::actor),
// answered with the run's summary (JSON) when it ends; scored samples and telemetry to record; the
// peers that joined, through the gate; an interrupt and why; its own deadlines (tick_atom: the
// learner's, the n-th sampler's, the listed evaluator nodes', the n-th evaluator's); telemetry.
using supervisor_actor = score_recorder::extend<
    caf::replies_to<plan_atom, std::vector<caf::actor>, std::vector<caf::actor>>::with<std::string>,
    caf::reacts_to<interrupt_atom, std::string>, caf::reacts_to<tick_atom, learner_atom>,
    caf::reacts_to<tick_atom, sampler_atom, uint64_t>, caf::reacts_to<tick_atom, plan_atom>,
    caf::reacts_to<tick_atom, uint64_t>>::extend_with<telemetry_source, telemetry_recorder, join_listener>;

// `launch serve`'s front (actors/service.hpp), a CAF broker on the service's TCP port: the
// network's events (a connection, its bytes, its close; the listening socket's close); bind and
// answer the port (listen_atom); close a refused connection once its answer is read (linger_atom,
// its handle and serial); stop taking requests (finish_atom); a stored verdict to answer (from the
// recorder: sample id, HTTP status, body, verdict, speedup); its own timer; telemetry; and, where
// the supervisor stands in a run, the peers that joined through the gate.
using service_front_actor = join_listener::extend<
    caf::reacts_to<caf::io::new_connection_msg>, caf::reacts_to<caf::io::new_data_msg>,
    caf::reacts_to<caf::io::connection_closed_msg>, caf::reacts_to<caf::io::acceptor_closed_msg>,
    caf::replies_to<listen_atom>::with<uint16_t>, caf::reacts_to<linger_atom, caf::io::connection_handle, uint64_t>,
    caf::reacts_to<finish_atom>, caf::reacts_to<record_atom, std::string, int, std::string, std::string, double>,
    caf::reacts_to<tick_atom>>::extend_with<telemetry_source>;

// Typed handles as they travel in messages (caf::actor), and back on arrival.
template <class Handle>
std::vector<caf::actor> as_actors(const std::vector<Handle>& handles) {
  std::vector<caf::actor> out;
  out.reserve(handles.size());
  for (auto& h : handles) out.push_back(caf::actor_cast<caf::actor>(h));
  return out;
}

template <class Handle>
std::vector<Handle> as_typed(const std::vector<caf::actor>& actors) {
  std::vector<Handle> out;
  out.reserve(actors.size());
  for (auto& a : actors) out.push_back(caf::actor_cast<Handle>(a));
  return out;
}

}  // namespace kernelrl

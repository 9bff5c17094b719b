// The actors' typed interfaces: what each accepts and answers, declared in one place beside the
// messages, so a message a receiver cannot handle does not compile (CAF typed actors). Converted
// so far: evaluator, reward, checkpoint_selector and dispatcher; the others still take dynamically typed
// messages, their protocols written in their headers. A typed handle crossing nodes travels as
// caf::actor (the gate's register messages) and is cast back on arrival.
#pragma once

#include "messages/messages.hpp"

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <string>

namespace kernelrl {

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
using dispatcher_actor = rollout_sink::extend<caf::reacts_to<register_atom, caf::actor, std::string>,
                                              caf::replies_to<stats_atom>::with<Telemetry>>;

// reward (actors/reward.hpp): scores a verdict and sends the ScoredRollout to its recorder.
using reward_actor = caf::typed_actor<caf::reacts_to<score_atom, Rollout, EvalResult>>;

// checkpoint_selector (actors/checkpoint_selector.hpp): a new checkpoint; the score of step N;
// pin step N; the best scored so far.
using selector_actor =
    caf::typed_actor<caf::reacts_to<Checkpoint>, caf::reacts_to<record_atom, StepStats>,
                     caf::reacts_to<keep_atom, uint32_t>, caf::replies_to<best_atom>::with<Checkpoint>>;

}  // namespace kernelrl

#include "actors/dispatcher.hpp"

#include "core/log.hpp"
#include "core/paths.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_set>

namespace kernelrl {

namespace {

struct Pending {
  Rollout rollout;
  EvalRequest request;
  std::string last_error;
  bool withdrawing = false;  // asked back from its evaluator for an idle one
  uint32_t passed_over = 0;  // times a later sample was dispatched first (task affinity)
};

struct EvaluatorSlot {
  evaluator_actor handle;  // registered as caf::actor (it may come through the gate), cast back
  std::string id;
  std::string node;                       // the part of id before '/'
  std::string site;                       // node and device: where a task's reference timing is kept
  std::map<uint64_t, Pending> in_flight;  // dispatch number -> the work it carries
  uint64_t done = 0;
  double busy_since = -1;  // holding work since (mono_s), -1: idle
};

// Per node: busy evaluator-seconds and answers, kept when its evaluators go away.
struct NodeTotals {
  double busy_s = 0, busy_s_reported = 0;
  uint64_t completed = 0;
};

struct dispatcher_state {
  std::deque<Pending> queue;
  std::vector<EvaluatorSlot> evaluators;
  std::unordered_set<std::string> completed_ids;  // results are idempotent by sample id
  uint64_t next_dispatch = 0;
  uint64_t received = 0, dispatched = 0, completed = 0, redispatched = 0, failed = 0, skipped = 0;
  uint64_t duplicates = 0, late = 0, foreign = 0, withdrawn = 0;
  std::map<std::string, NodeTotals> nodes;
  std::map<std::string, std::set<std::string>> task_sites;  // task id -> sites it was dispatched to
  uint64_t task_site_pairs = 0;                             // sum of their sizes, ever
  std::deque<caf::typed_response_promise<bool>> held;       // producers' answers, held while the queue is full
  double last_stats = -1;  // mono_s of the last telemetry answer (utilisation is over the interval)
  static inline const char* name = "dispatcher";
};

using self_ptr = dispatcher_actor::stateful_pointer<dispatcher_state>;
// The settings, shared by the handlers (an answer's handler captures the pointer, not a copy of the task map).
using ArgsPtr = std::shared_ptr<const DispatcherArgs>;

// Keeps the busy time of a slot: an evaluator is busy while it holds any work.
void account(self_ptr self, EvaluatorSlot& e, bool closing = false) {
  double now = mono_s();
  bool busy = !e.in_flight.empty() && !closing;
  if (e.busy_since >= 0 && (!busy || closing)) {
    self->state.nodes[e.node].busy_s += now - e.busy_since;
    e.busy_since = -1;
  }
  if (busy && e.busy_since < 0) e.busy_since = now;
}

void pump(self_ptr self, const ArgsPtr& args, const reward_actor& reward);

// Where an evaluator's reference timings are kept: its node and device ("n1/cuda:0" for "n1/cuda:0"
// and "n1/cuda:0#2"; "n1/cpu" for every CPU slot "n1/cpu-K"). An id without a device is its own site.
std::string site_of(const std::string& id) {
  auto slash = id.find('/');
  if (slash == std::string::npos) return id;
  std::string dev = id.substr(slash + 1);
  if (dev.rfind("cpu", 0) == 0) dev = "cpu";
  return id.substr(0, slash + 1) + dev.substr(0, dev.find('#'));
}

// The work of dispatch `n` to `target`, taken out of its slot; nullopt when it is no longer there
// (its evaluator went down and the work was re-queued: this answer is late and is dropped).
std::optional<Pending> take(self_ptr self, const evaluator_actor& target, uint64_t n, bool answered) {
  for (auto& e : self->state.evaluators) {
    if (e.handle != target) continue;
    auto it = e.in_flight.find(n);
    if (it == e.in_flight.end()) break;
    Pending p = std::move(it->second);
    e.in_flight.erase(it);
    e.done += answered ? 1 : 0;
    self->state.nodes[e.node].completed += answered ? 1 : 0;
    account(self, e);
    return p;
  }
  ++self->state.late;
  return std::nullopt;
}

void finish(self_ptr self, const reward_actor& reward, Pending&& p, EvalResult&& r) {
  if (!self->state.completed_ids.insert(p.rollout.sample_id).second) {
    ++self->state.duplicates;  // a second verdict for a sample: never scored twice
    log::get("dispatcher")->warn("sample {}: a second verdict arrived and was dropped", p.rollout.sample_id);
    return;
  }
  ++self->state.completed;
  self->send(reward, score_atom::value, std::move(p.rollout), std::move(r));
}

// A dispatch failed or its evaluator went away: back to the queue, or recorded as a
// runtime_error after max_attempts.
void retry(self_ptr self, const ArgsPtr& args, const reward_actor& reward, Pending&& p, const std::string& why) {
  p.last_error = why;
  if (++p.request.attempt >= args->max_attempts) {
    log::get("dispatcher")
        ->error("sample {}: evaluation failed on {} dispatches ({}); recorded as runtime_error", p.rollout.sample_id,
                p.request.attempt, p.last_error);
    EvalResult r;
    r.sample_id = p.rollout.sample_id;
    r.task_id = p.rollout.task_id;
    r.status = EvalStatus::runtime_error;
    r.error = "evaluation failed on " + std::to_string(p.request.attempt) + " dispatches: " + p.last_error;
    ++self->state.failed;
    finish(self, reward, std::move(p), std::move(r));
  } else {
    ++self->state.redispatched;
    self->state.queue.push_front(std::move(p));
  }
}

// Task affinity. A task's reference is timed once per device of a node and kept there (the
// evaluators sharing that GPU, or a node's CPU slots, share the timing: gpu/shared_timings.py), so
// a task's samples spread over n such sites pay for n reference timings, each a timed region alone
// on its device. With evaluators on more than one site, a free evaluator takes the oldest queued
// sample of a task its site has seen; failing that, a task no site has seen yet (it starts that
// task's reference there instead of repeating another's); failing that, the oldest. Samples only
// ever wait while an evaluator of a site that has their task is busy: the oldest is dispatched
// first once `kMaxPassedOver` later ones have gone before it, so a slow site cannot hold its
// tasks' samples back for long. With one site the queue's order is kept.
constexpr uint32_t kMaxPassedOver = 32;  // a GRPO group of 16 taken by another node twice over
constexpr size_t kAffinityWindow = 512;  // queued samples looked at for each dispatch

size_t choose(dispatcher_state& st, const EvaluatorSlot& to) {
  if (st.queue.front().passed_over >= kMaxPassedOver) return 0;
  bool several = std::any_of(st.evaluators.begin(), st.evaluators.end(),
                             [&](const EvaluatorSlot& e) { return e.site != st.evaluators.front().site; });
  if (!several) return 0;
  size_t fresh = st.queue.size(), n = std::min(st.queue.size(), kAffinityWindow);
  for (size_t i = 0; i < n; ++i) {
    auto it = st.task_sites.find(st.queue[i].request.task_id);
    if (it == st.task_sites.end()) {
      fresh = std::min(fresh, i);
      continue;
    }
    if (it->second.count(to.site)) return i;
  }
  return fresh < st.queue.size() ? fresh : 0;
}

void pump(self_ptr self, const ArgsPtr& args, const reward_actor& reward) {
  auto& st = self->state;
  while (!st.queue.empty()) {
    EvaluatorSlot* best = nullptr;
    for (auto& e : st.evaluators)
      if (e.in_flight.size() < args->max_in_flight && (!best || e.in_flight.size() < best->in_flight.size())) best = &e;
    if (!best) return;
    size_t pick = choose(st, *best);
    for (size_t i = 0; i < pick; ++i) ++st.queue[i].passed_over;
    Pending p = std::move(st.queue[pick]);
    st.queue.erase(st.queue.begin() + std::ptrdiff_t(pick));
    if (st.task_sites[p.request.task_id].insert(best->site).second) ++st.task_site_pairs;
    while (!st.held.empty() && st.queue.size() < args->max_queue) {  // room again: let one more in
      st.held.front().deliver(true);
      st.held.pop_front();
    }
    ++st.dispatched;
    uint64_t n = ++st.next_dispatch;
    auto target = best->handle;
    auto req = p.request;
    best->in_flight.emplace(n, std::move(p));
    account(self, *best);
    self->request(target, caf::infinite, eval_atom::value, std::move(req))
        .then(
            [=](EvalResult& r) {
              if (auto p = take(self, target, n, true)) finish(self, reward, std::move(*p), std::move(r));
              pump(self, args, reward);
            },
            [=](caf::error& err) {
              if (auto p = take(self, target, n, false)) {
                if (p->withdrawing && error_text(self->system(), err) == withdrawn_error) {
                  // Given back unstarted for an idle evaluator: not a failed attempt.
                  p->withdrawing = false;
                  ++self->state.withdrawn;
                  self->state.queue.push_front(std::move(*p));
                } else {
                  retry(self, args, reward, std::move(*p), self->system().render(err));
                }
              }
              pump(self, args, reward);
            });
  }
  // Nothing left to hand out: an idle evaluator takes work that waits behind a running one
  // elsewhere (the newest request of the evaluator holding the most), so a slow or hung
  // candidate delays only itself.
  size_t idle = 0, asked = 0;
  for (auto& e : st.evaluators) {
    idle += e.in_flight.empty();
    for (auto& [n, p] : e.in_flight) asked += p.withdrawing;
  }
  while (asked < idle) {
    EvaluatorSlot* most = nullptr;
    Pending* newest = nullptr;
    size_t most_left = 1;  // the oldest request is likely running: never asked for
    for (auto& e : st.evaluators) {
      size_t left = 0;
      Pending* last = nullptr;
      for (auto& [n, p] : e.in_flight)
        if (!p.withdrawing) {
          ++left;
          last = &p;
        }
      if (left > most_left) {
        most_left = left;
        most = &e;
        newest = last;
      }
    }
    if (!newest) return;
    newest->withdrawing = true;
    ++asked;
    self->send(most->handle, withdraw_atom::value, newest->rollout.sample_id);
  }
}

// Messages that only this process may send (a remote peer reaches the dispatcher through the
// gate, never directly).
bool from_here(self_ptr self) {
  auto sender = self->current_sender();
  if (!sender || sender->node() == self->node()) return true;
  ++self->state.foreign;
  log::get("dispatcher")->warn("dropped a message from another node ({})", caf::to_string(sender->node()));
  return false;
}

dispatcher_actor::behavior_type dispatcher_behavior(self_ptr self, DispatcherArgs settings, reward_actor reward) {
  ArgsPtr args = std::make_shared<const DispatcherArgs>(std::move(settings));
  auto lg = log::get("dispatcher");
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& evs = self->state.evaluators;
    for (auto it = evs.begin(); it != evs.end(); ++it) {
      if (it->handle.address() != dm.source) continue;
      lg->warn("evaluator {} is down ({}); its {} request(s) in flight go back to the queue", it->id,
               self->system().render(dm.reason), it->in_flight.size());
      account(self, *it, true);
      auto items = std::move(it->in_flight);
      std::string site = it->site;
      evs.erase(it);
      if (std::none_of(evs.begin(), evs.end(), [&](const EvaluatorSlot& e) { return e.site == site; })) {
        // Nobody there to wait for: its tasks are others' again, or fresh where it held them alone.
        auto& ts = self->state.task_sites;
        for (auto t = ts.begin(); t != ts.end();) {
          t->second.erase(site);
          t = t->second.empty() ? ts.erase(t) : std::next(t);
        }
      }
      for (auto rit = items.rbegin(); rit != items.rend(); ++rit)
        retry(self, args, reward, std::move(rit->second), "evaluator went down: " + self->system().render(dm.reason));
      break;
    }
    pump(self, args, reward);
  });
  return {
      // A producer's request is answered once the rollout is in the queue and the queue has
      // room: a sampler that keeps a window of unanswered requests is held back (backpressure).
      [=](Rollout& r) -> caf::result<bool> {
        if (!from_here(self)) return caf::make_error(caf::sec::runtime_error, "rollouts come from this process only");
        auto rp = self->make_response_promise<bool>();
        auto& st = self->state;
        if (st.queue.size() >= args->max_queue)
          st.held.push_back(rp);
        else
          rp.deliver(true);
        ++self->state.received;
        Pending p;
        p.request.sample_id = r.sample_id;
        p.request.task_id = r.task_id;
        p.request.action = r.completion;
        p.request.action_space = args->action_space;
        p.request.mode = args->mode;
        p.request.seed = args->seed;
        auto it = args->task_paths.find(r.task_id);
        p.rollout = std::move(r);
        if (it == args->task_paths.end()) {
          // Nothing to evaluate against: recorded, never dropped.
          EvalResult res;
          res.sample_id = p.rollout.sample_id;
          res.task_id = p.rollout.task_id;
          res.status = EvalStatus::runtime_error;
          res.error = "task " + p.rollout.task_id + ": no such task in the experiment's task set";
          lg->error("sample {}: {}", res.sample_id, res.error);
          finish(self, reward, std::move(p), std::move(res));
          return rp;
        }
        p.request.task_path = it->second;
        self->state.queue.push_back(std::move(p));
        pump(self, args, reward);
        return rp;
      },
      // A rollout a selection strategy left out before evaluation: no evaluator sees it; it is
      // scored and stored with status skipped (kept for audit, never a verdict).
      [=](skip_atom, Rollout& r, std::string& why) {
        if (!from_here(self)) return;
        ++self->state.received;
        ++self->state.skipped;
        Pending p;
        p.rollout = std::move(r);
        EvalResult res;
        res.sample_id = p.rollout.sample_id;
        res.task_id = p.rollout.task_id;
        res.status = EvalStatus::skipped;
        res.error = std::move(why);
        finish(self, reward, std::move(p), std::move(res));
      },
      [=](register_atom, caf::actor ev, std::string id) {
        if (!from_here(self)) return;
        self->monitor(ev);
        EvaluatorSlot slot;
        slot.handle = caf::actor_cast<evaluator_actor>(ev);
        slot.id = id;
        slot.node = evaluator_node(id);
        slot.site = site_of(id);
        self->state.evaluators.push_back(std::move(slot));
        lg->debug("evaluator {} registered ({} now)", id, self->state.evaluators.size());
        pump(self, args, reward);
      },
      [=](stats_atom) {
        auto& st = self->state;
        Telemetry t;
        t.ts = now_s();
        t.source = "dispatcher";
        uint64_t in_flight = 0;
        for (auto& e : st.evaluators) in_flight += e.in_flight.size();
        t.values = {{"queue_depth", double(st.queue.size())},
                    {"in_flight", double(in_flight)},
                    {"evaluators", double(st.evaluators.size())},
                    {"received", double(st.received)},
                    {"dispatched", double(st.dispatched)},
                    {"completed", double(st.completed)},
                    {"redispatched", double(st.redispatched)},
                    {"failed_dispatch", double(st.failed)},
                    {"duplicates_dropped", double(st.duplicates)},
                    {"late_answers", double(st.late)},
                    {"foreign_dropped", double(st.foreign)},
                    {"withdrawn", double(st.withdrawn)},
                    {"skipped", double(st.skipped)},
                    {"task_sites", double(st.task_site_pairs)},
                    {"producers_held", double(st.held.size())}};
        // Per node: evaluators, work held, capacity, answers, and utilisation (the share of its
        // evaluators' time spent holding work since the previous answer).
        double now = mono_s(), dt = st.last_stats < 0 ? 0 : now - st.last_stats;
        st.last_stats = now;
        std::map<std::string, std::pair<uint64_t, uint64_t>> per;  // node -> (evaluators, in flight)
        for (auto& e : st.evaluators) {
          account(self, e, true);  // close the open interval at `now` ...
          account(self, e);        // ... and reopen it
          per[e.node].first += 1;
          per[e.node].second += e.in_flight.size();
        }
        double busy_all = 0;
        uint64_t evs_all = 0;
        for (auto& [node, tot] : st.nodes) {
          auto [evs, held] = per[node];
          double busy = tot.busy_s - tot.busy_s_reported;
          tot.busy_s_reported = tot.busy_s;
          double util = dt > 0 && evs > 0 ? std::min(1.0, busy / (dt * double(evs))) : 0.0;
          std::string k = "node." + node + ".";
          t.values[k + "evaluators"] = double(evs);
          t.values[k + "in_flight"] = double(held);
          t.values[k + "capacity"] = double(evs * args->max_in_flight);
          t.values[k + "completed"] = double(tot.completed);
          t.values[k + "utilisation"] = util;
          busy_all += busy;
          evs_all += evs;
        }
        t.values["utilisation"] = dt > 0 && evs_all > 0 ? std::min(1.0, busy_all / (dt * double(evs_all))) : 0.0;
        return t;
      },
  };
}

}  // namespace

dispatcher_actor spawn_dispatcher(caf::actor_system& sys, DispatcherArgs args, reward_actor reward) {
  return sys.spawn(dispatcher_behavior, std::move(args), std::move(reward));
}

}  // namespace kernelrl

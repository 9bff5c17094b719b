#include "actors/dispatcher.hpp"

#include "core/log.hpp"
#include "core/paths.hpp"

#include <caf/all.hpp>

#include <deque>

namespace kernelrl {

namespace {

struct Pending {
  Rollout rollout;
  EvalRequest request;
  std::string last_error;
};

struct EvaluatorSlot {
  caf::actor handle;
  std::string id;
  uint32_t in_flight = 0;
  uint64_t done = 0;
};

struct dispatcher_state {
  std::deque<Pending> queue;
  std::vector<EvaluatorSlot> evaluators;
  uint64_t received = 0, dispatched = 0, completed = 0, redispatched = 0, failed = 0;
  static inline const char* name = "dispatcher";
};

using self_ptr = caf::stateful_actor<dispatcher_state>*;

void pump(self_ptr self, const DispatcherArgs& args, const caf::actor& reward);

// One request to `target` ended; `answered` when it came back with a verdict.
void release(self_ptr self, const caf::actor& target, bool answered) {
  for (auto& e : self->state.evaluators) {
    if (e.handle == target && e.in_flight > 0) {
      --e.in_flight;
      e.done += answered ? 1 : 0;
    }
  }
}

void finish(self_ptr self, const caf::actor& reward, Pending&& p, EvalResult&& r) {
  ++self->state.completed;
  self->send(reward, score_atom::value, std::move(p.rollout), std::move(r));
}

void pump(self_ptr self, const DispatcherArgs& args, const caf::actor& reward) {
  auto& st = self->state;
  while (!st.queue.empty()) {
    EvaluatorSlot* best = nullptr;
    for (auto& e : st.evaluators)
      if (e.in_flight < args.max_in_flight && (!best || e.in_flight < best->in_flight)) best = &e;
    if (!best) return;
    Pending p = std::move(st.queue.front());
    st.queue.pop_front();
    ++best->in_flight;
    ++st.dispatched;
    auto target = best->handle;
    auto req = p.request;
    self->request(target, caf::infinite, eval_atom::value, std::move(req))
        .then(
            [=](EvalResult& r) mutable {
              release(self, target, true);
              finish(self, reward, std::move(p), std::move(r));
              pump(self, args, reward);
            },
            [=](caf::error& err) mutable {
              release(self, target, false);
              p.last_error = self->system().render(err);
              if (++p.request.attempt >= args.max_attempts) {
                auto lg = log::get("dispatcher");
                lg->error("sample {}: evaluation failed on {} dispatches ({}); recorded as runtime_error",
                          p.rollout.sample_id, p.request.attempt, p.last_error);
                EvalResult r;
                r.sample_id = p.rollout.sample_id;
                r.task_id = p.rollout.task_id;
                r.status = EvalStatus::runtime_error;
                r.error = "evaluation failed on " + std::to_string(p.request.attempt) +
                          " dispatches: " + p.last_error;
                ++self->state.failed;
                finish(self, reward, std::move(p), std::move(r));
              } else {
                ++self->state.redispatched;
                self->state.queue.push_front(std::move(p));
              }
              pump(self, args, reward);
            });
  }
}

caf::behavior dispatcher_actor(self_ptr self, DispatcherArgs args, caf::actor reward) {
  auto lg = log::get("dispatcher");
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& evs = self->state.evaluators;
    for (auto it = evs.begin(); it != evs.end(); ++it) {
      if (it->handle.address() == dm.source) {
        lg->warn("evaluator {} is down ({}); its work goes back to the queue", it->id,
                 self->system().render(dm.reason));
        evs.erase(it);
        break;
      }
    }
  });
  return {
      [=](Rollout& r) {
        ++self->state.received;
        Pending p;
        p.request.sample_id = r.sample_id;
        p.request.task_id = r.task_id;
        p.request.action = r.completion;
        p.request.action_space = args.action_space;
        p.request.mode = args.mode;
        p.request.seed = args.seed;
        auto it = args.task_paths.find(r.task_id);
        p.rollout = std::move(r);
        if (it == args.task_paths.end()) {
          // Nothing to evaluate against: recorded, never dropped.
          EvalResult res;
          res.sample_id = p.rollout.sample_id;
          res.task_id = p.rollout.task_id;
          res.status = EvalStatus::runtime_error;
          res.error = "task " + p.rollout.task_id + ": no such task in the experiment's task set";
          lg->error("sample {}: {}", res.sample_id, res.error);
          finish(self, reward, std::move(p), std::move(res));
          return;
        }
        p.request.task_path = it->second;
        self->state.queue.push_back(std::move(p));
        pump(self, args, reward);
      },
      [=](register_atom, caf::actor ev, std::string id) {
        self->monitor(ev);
        self->state.evaluators.push_back({ev, id});
        lg->debug("evaluator {} registered ({} now)", id, self->state.evaluators.size());
        pump(self, args, reward);
      },
      [=](stats_atom) {
        auto& st = self->state;
        Telemetry t;
        t.ts = now_s();
        t.source = "dispatcher";
        uint64_t in_flight = 0;
        for (auto& e : st.evaluators) in_flight += e.in_flight;
        t.values = {{"queue_depth", double(st.queue.size())},
                    {"in_flight", double(in_flight)},
                    {"evaluators", double(st.evaluators.size())},
                    {"received", double(st.received)},
                    {"dispatched", double(st.dispatched)},
                    {"completed", double(st.completed)},
                    {"redispatched", double(st.redispatched)},
                    {"failed_dispatch", double(st.failed)}};
        return t;
      },
  };
}

}  // namespace

caf::actor spawn_dispatcher(caf::actor_system& sys, DispatcherArgs args, caf::actor reward) {
  return sys.spawn(dispatcher_actor, std::move(args), std::move(reward));
}

}  // namespace kernelrl

#include "actors/supervisor.hpp"
#include "actors/unexpected.hpp"
#include "experiment/sampler_pool.hpp"

#include "core/files.hpp"
#include "core/log.hpp"
#include "core/paths.hpp"
#include "store/store.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <set>
#include <utility>

namespace kernelrl {

namespace {

struct supervisor_state {
  std::unique_ptr<Store> store;
  std::unique_ptr<Experiment> experiment;
  caf::typed_response_promise<std::string> done;
  std::vector<sampler_actor> samplers;
  std::vector<std::string> sampler_names;                    // "sampler-i" on the head; a joined one's own id
  std::vector<std::pair<sampler_actor, std::string>> early;  // joined before the run started
  bool running = false;                                      // the plan has come
  SamplerPool pool{0};
  size_t sample_all = SIZE_MAX;               // the sampler sampling every task once (eval, best_of_n)
  bool sample_all_waits = false;              // ... and none was running when it was asked for
  uint64_t sampler_waits = 0;                 // sampler join deadlines started (only the latest counts)
  bool sampler_deadline = false;              // one is running
  std::vector<std::string> refused_samplers;  // joined, but could not take the weights (why)
  learner_actor learner;                      // args' or, from the learner node, as registered
  selector_actor selector;
  bool start_waits = false;     // the plan has come; a learning run waits for its learner
  std::string last_checkpoint;  // the newest the learner saved ("": none this run)
  bool finished = false;
  uint64_t duplicates = 0, store_failures = 0;
  size_t evaluators_alive = 0;
  uint64_t waits = 0;             // join deadlines started (a deadline only counts if it is the latest)
  std::set<std::string> awaited;  // listed evaluator nodes none of whose evaluators has registered yet
  bool start_deferred = false;    // the plan has come; the run waits for them
  static inline const char* name = "supervisor";
};

using self_ptr = supervisor_actor::stateful_pointer<supervisor_state>;

template <class... F>
struct overloaded : F... {
  using F::operator()...;
};
template <class... F>
overloaded(F...) -> overloaded<F...>;

void finish(self_ptr self, const SupervisorArgs& args, const std::string& error, bool interrupted = false) {
  auto& st = self->state;
  if (st.finished) return;
  st.finished = true;
  st.experiment->halt();
  auto lg = log::get("supervisor");
  const auto& run_id = args.experiment.run_id;
  const auto rows = st.store ? st.store->steps(run_id) : std::vector<Store::StepRow>{};
  nlohmann::json j = st.experiment->summary(error, rows);
  if (interrupted) j["interrupted"] = true;
  j["duplicates_dropped"] = st.duplicates;
  j["store_failures"] = st.store_failures;
  if (!args.store_path.empty()) {
    auto path = std::filesystem::path(args.store_path).parent_path() / "compute.json";
    std::string err;
    if (!write_file_durably(path.string(), j["compute"].dump(2) + "\n", err)) lg->error("{}", err);
  }
  if (st.store) {
    auto row = st.experiment->final_row();
    if (row && !st.store->record_step(run_id, *row))
      lg->error("store: cannot record step {}: {}", row->step, st.store->last_error());
    if (!st.store->finish_run(run_id, interrupted ? "interrupted" : error.empty() ? "completed" : "failed", j.dump()))
      lg->error("store: cannot finish run: {}", st.store->last_error());
  }
  if (error.empty())
    lg->info("run {} complete: {} samples, {} correct", run_id, j.value("samples", uint64_t(0)),
             j.value("correct", uint64_t(0)));
  else if (interrupted)
    lg->warn("run {} interrupted: {} ({} samples recorded)", run_id, error, j.value("samples", uint64_t(0)));
  else
    lg->error("run {} failed: {}", run_id, error);
  if (st.done.pending()) st.done.deliver(j.dump());
}

void apply(self_ptr self, const SupervisorArgs& args, Actions actions);
void learner_lost(self_ptr self, const SupervisorArgs& args, const std::string& why);
void begin_experiment(self_ptr self, const SupervisorArgs& args);

// Sends each sampler its part of a plan; `done` once every part is answered (a part whose sampler
// went away counts as answered: the pool plans its groups again). A sampler refusing its part
// ends the run.
void send_parts(self_ptr self, const SupervisorArgs& args, std::vector<SamplerPool::Assignment> parts,
                std::function<void()> done) {
  auto left = std::make_shared<size_t>(parts.size());
  if (parts.empty()) {
    done();
    return;
  }
  for (auto& [i, plan] : parts) {
    const uint32_t step = plan.step;
    const size_t to = i;
    self->request(self->state.samplers[to], caf::infinite, std::move(plan))
        .then(
            [=](uint64_t) {
              if (--*left == 0) done();
            },
            [=](caf::error& e) {
              if (e == caf::sec::request_receiver_down || !self->state.pool.is_alive(to)) {
                if (--*left == 0) done();
                return;
              }
              finish(self, args,
                     fmt::format("{} failed to plan step {}: {}", self->state.sampler_names[to], step,
                                 error_text(self->system(), e)));
            });
  }
}

// No sampler is running and work waits for one: a cluster waits join_wait_s for a sampler to join
// (a sampler node starting or coming back); a single node ends the run at once.
void wait_for_sampler(self_ptr self, const SupervisorArgs& args, const std::string& why) {
  auto& st = self->state;
  if (st.finished) return;
  if (args.join_wait_s <= 0) {
    finish(self, args, why);
    return;
  }
  if (st.sampler_deadline) return;  // the first deadline stands
  st.sampler_deadline = true;
  const uint64_t n = ++st.sampler_waits;
  // A head without samplers of its own waits for its sampler nodes at every start: not a warning.
  if (st.samplers.empty())
    log::get("supervisor")->info("{} (none has joined yet); waiting up to {:g} s for one", why, args.join_wait_s);
  else
    log::get("supervisor")->warn("{}; waiting up to {:g} s for a sampler to join", why, args.join_wait_s);
  self->delayed_send(self, std::chrono::milliseconds(static_cast<int64_t>(args.join_wait_s * 1000)), tick_atom::value,
                     sampler_atom::value, n);
}

void sample_all(self_ptr self, const SupervisorArgs& args);

// Sampler i is gone: its unfinished groups go to the others (or wait for one to join).
void sampler_lost(self_ptr self, const SupervisorArgs& args, size_t i, const std::string& why) {
  auto& st = self->state;
  if (st.finished || !st.pool.is_alive(i)) return;
  const uint64_t open = st.pool.load(i);
  auto parts = st.pool.lost(i);
  auto lg = log::get("supervisor");
  const std::string& who = st.sampler_names[i];
  if (i == st.sample_all && !st.experiment->all_in()) {  // that plan is the sampler's own: not re-plannable
    finish(self, args,
           fmt::format("{}, which was sampling every task, is gone ({}); {} samples were not sampled or have "
                       "no verdict",
                       who, why, st.experiment->outstanding()));
    return;
  }
  if (st.pool.alive() == 0) {
    if (!st.experiment->all_in() && st.pool.waiting() > 0)
      wait_for_sampler(
          self, args,
          fmt::format("every sampler is gone (the last: {}, {}); {} samples were not sampled", who, why, open));
    return;
  }
  uint64_t moved = 0;
  for (auto& [to, p] : parts) moved += uint64_t(p.task_ids.size()) * p.n;
  lg->warn("{} is gone ({}): {} of its samples not yet stored; {} planned again on the {} left", who, why, open, moved,
           st.pool.alive());
  send_parts(self, args, std::move(parts), [] {});
}

// A sampler is running and serves the current policy: it takes its share from now on, and the
// groups that waited for one.
void adopt_sampler(self_ptr self, const SupervisorArgs& args, sampler_actor s, const std::string& name) {
  auto& st = self->state;
  if (st.finished) return;
  st.samplers.push_back(s);
  st.sampler_names.push_back(name);
  st.pool.add();
  self->monitor(s);
  const size_t waiting = st.pool.waiting();
  log::get("supervisor")
      ->info("{} joined ({} sampler(s) running){}", name, st.pool.alive(),
             waiting ? fmt::format("; {} group(s) that waited for a sampler go to it", waiting) : "");
  send_parts(self, args, st.pool.adopt(), [] {});
  if (st.sample_all_waits) sample_all(self, args);
}

// A sampler on another node has joined (through the gate): in a learning mode the learner first
// publishes the current weights to it, so that it never samples with others.
void sampler_joined(self_ptr self, const SupervisorArgs& args, sampler_actor s, const std::string& name) {
  auto& st = self->state;
  if (st.finished || !s) return;
  const auto known = [&](const sampler_actor& x) { return x == s; };
  if (std::any_of(st.samplers.begin(), st.samplers.end(), known) ||
      std::any_of(st.early.begin(), st.early.end(), [&](auto& e) { return e.first == s; })) {
    log::get("supervisor")->warn("{} registered twice: the second registration is ignored", name);
    return;
  }
  if (!st.running || st.start_waits || st.start_deferred) {  // not started (or waits for its learner or nodes)
    st.early.emplace_back(std::move(s), name);
    return;
  }
  if (!traits(args.experiment.mode).learns || !st.learner) {
    adopt_sampler(self, args, std::move(s), name);
    return;
  }
  self->request(st.learner, caf::infinite, sync_atom::value, caf::actor_cast<caf::actor>(s), name)
      .then([=](uint64_t) { adopt_sampler(self, args, s, name); },
            [=](caf::error& e) {
              const std::string why = error_text(self->system(), e);
              log::get("supervisor")
                  ->warn("{} joined but could not take the current weights ({}): it is not used", name, why);
              self->state.refused_samplers.push_back(name + ": " + why);
            });
}

// Every task once (eval, best_of_n): the replay sampler, or the first model sampler running (a
// cluster whose samplers are all on other nodes waits for one).
void sample_all(self_ptr self, const SupervisorArgs& args) {
  auto& st = self->state;
  size_t i = 0;
  while (i < st.samplers.size() && !st.pool.is_alive(i)) ++i;
  if (i == st.samplers.size()) {
    st.sample_all_waits = true;
    wait_for_sampler(self, args, "no sampler is running");
    return;
  }
  st.sample_all_waits = false;
  st.sample_all = i;
  self->request(st.samplers[i], caf::infinite, plan_atom::value, uint32_t{0})
      .then([=](uint64_t n) { apply(self, args, self->state.experiment->planned(n)); },
            [=](caf::error& e) { finish(self, args, "sampler failed: " + self->system().render(e)); });
}

// Carries out the experiment's actions, in order.
void apply(self_ptr self, const SupervisorArgs& args, Actions actions) {
  auto& st = self->state;
  auto lg = log::get("supervisor");
  const auto& run_id = args.experiment.run_id;
  for (auto& action : actions) {
    std::visit(
        overloaded{
            [&](act::Sample& a) {
              const uint64_t n = uint64_t(a.plan.task_ids.size()) * std::max<uint32_t>(1, a.plan.n);
              const uint32_t step = a.plan.step;
              auto parts = st.pool.assign(a.plan);
              if (parts.empty()) {  // no sampler running: the groups wait in the pool for one
                wait_for_sampler(self, args, fmt::format("no sampler is running to sample step {}", step));
                if (!st.finished) apply(self, args, st.experiment->planned(n));
                return;
              }
              send_parts(self, args, std::move(parts), [=] { apply(self, args, self->state.experiment->planned(n)); });
            },
            [&](act::SampleAll&) { sample_all(self, args); },
            [&](act::LearnStep& a) {
              const uint32_t step = a.step;
              self->request(st.learner, caf::infinite, plan_atom::value, a.step, a.groups)
                  .then([=](StepUpdate& u) { apply(self, args, self->state.experiment->updated(u)); },
                        [=](caf::error& e) {
                          if (e == caf::sec::request_receiver_down && !args.learner_node.empty()) {
                            learner_lost(self, args, fmt::format("it went away during step {}", step));
                            return;
                          }
                          finish(self, args,
                                 fmt::format("learner failed at step {}: {}", step, error_text(self->system(), e)));
                        });
            },
            [&](act::Learn& a) { self->send(st.learner, train_atom::value, std::move(a.sample), a.last); },
            [&](act::StepDone& a) {
              if (st.store && !st.store->record_step(run_id, a.stats))
                lg->error("store: cannot record step {}: {}", a.stats.step, st.store->last_error());
              if (st.selector) self->send(st.selector, record_atom::value, a.stats);
            },
            [&](act::StepLearned& a) {
              st.last_checkpoint = a.checkpoint.path;
              if (!st.store) return;
              if (!st.store->record_step(run_id, a.stats, a.learner))
                lg->error("store: cannot record step {}: {}", a.stats.step, st.store->last_error());
              if (!st.store->record_checkpoint(run_id, a.checkpoint))
                lg->error("store: cannot record checkpoint {}: {}", a.checkpoint.path, st.store->last_error());
            },
            [&](act::Keep& a) {
              if (st.selector) self->send(st.selector, keep_atom::value, uint32_t(a.version));
            },
            [&](act::Finish& a) { finish(self, args, a.error); },
        },
        action);
  }
}

// The learner node's learner is gone: the run ends, naming where it can go on from.
void learner_lost(self_ptr self, const SupervisorArgs& args, const std::string& why) {
  auto& st = self->state;
  const std::string at = st.last_checkpoint.empty() ? std::string("no checkpoint of this run was saved")
                                                    : fmt::format("its last checkpoint is {} (on node {})",
                                                                  st.last_checkpoint, args.learner_node);
  finish(self, args,
         fmt::format("the learner of node {} is gone ({}); {}; once the node runs again, `launch CONFIG --resume "
                     "{}` continues the run",
                     args.learner_node, why, at, args.experiment.run_dir));
}

// The experiment starts: a learning mode once the learner has published its weights (a resumed
// run: its checkpoint's, with the store's samples and steps of the run so far). Then the samplers
// that joined before it are taken.
void start(self_ptr self, const SupervisorArgs& args) {
  auto& st = self->state;
  begin_experiment(self, args);
  if (!st.start_waits)  // else they are taken once the learner has joined
    for (auto& [s, name] : std::exchange(st.early, {})) sampler_joined(self, args, s, name);
}

void begin_experiment(self_ptr self, const SupervisorArgs& args) {
  auto& st = self->state;
  if (!traits(args.experiment.mode).learns) {
    apply(self, args, st.experiment->start(0, {}, {}));
    return;
  }
  if (!st.learner && !args.learner_node.empty()) {  // the learner node's has not registered yet
    if (st.start_waits) return;
    st.start_waits = true;
    log::get("supervisor")
        ->info("waiting up to {:g} s for the learner of node {} to join", args.join_wait_s, args.learner_node);
    self->delayed_send(self, std::chrono::milliseconds(static_cast<int64_t>(args.join_wait_s * 1000)), tick_atom::value,
                       learner_atom::value);
    return;
  }
  st.start_waits = false;
  if (!st.learner) {
    finish(self, args, fmt::format("{} mode needs a learner", name(args.experiment.mode)));
    return;
  }
  self->request(st.learner, caf::infinite, sync_atom::value, as_actors(st.samplers))
      .then(
          [=](uint64_t v) {
            auto& st = self->state;
            std::vector<ScoredRollout> earlier;
            std::vector<Store::StepRow> rows;
            if (args.resume) {
              for (auto& row : st.store->samples(args.experiment.run_id)) earlier.push_back(std::move(row.record));
              rows = st.store->steps(args.experiment.run_id);
            }
            apply(self, args, st.experiment->start(v, earlier, rows));
          },
          [=](caf::error& e) {
            finish(self, args, "learner could not publish its weights: " + error_text(self->system(), e));
          });
}

std::string node_list(const std::set<std::string>& nodes) {
  std::string out;
  for (auto& n : nodes) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// No evaluator running: a single node fails at once; a cluster waits join_wait_s for one to join
// (a node restarting, a new machine) before it gives up.
void none_left(self_ptr self, const SupervisorArgs& args, const std::string& why) {
  auto& st = self->state;
  if (st.finished || st.experiment->all_in()) return;
  if (args.join_wait_s <= 0) {
    finish(self, args, why);
    return;
  }
  uint64_t n = ++st.waits;
  log::get("supervisor")->warn("no evaluator is running; waiting up to {:g} s for one to join", args.join_wait_s);
  self->delayed_send(self, std::chrono::milliseconds(static_cast<int64_t>(args.join_wait_s * 1000)), tick_atom::value,
                     n);
}

// The run's plan: its samplers and evaluators, watched; the run starts (or finishes at once, with
// no store or no evaluator on a single node). The promise is kept when the run finishes.
caf::typed_response_promise<std::string> plan(self_ptr self, const SupervisorArgs& args,
                                              std::vector<sampler_actor> samplers,
                                              const std::vector<caf::actor>& evaluators,
                                              const std::string& store_error) {
  auto& st = self->state;
  st.done = self->make_response_promise<std::string>();
  st.samplers = std::move(samplers);
  for (size_t i = 0; i < st.samplers.size(); ++i) st.sampler_names.push_back("sampler-" + std::to_string(i));
  st.pool = SamplerPool(st.samplers.size());
  for (auto& s : st.samplers) self->monitor(s);
  st.running = true;
  st.evaluators_alive += evaluators.size();  // (and any that joined before the plan came)
  for (auto& e : evaluators) self->monitor(e);
  if (!st.store) {
    finish(self, args, "the run store could not be opened: " + store_error);
    return st.done;
  }
  if (st.evaluators_alive == 0) {
    none_left(self, args, "no evaluator is running (see the errors above)");
    if (st.finished) return st.done;
  }
  if (!st.awaited.empty()) {
    st.start_deferred = true;
    log::get("supervisor")
        ->info("waiting up to {:g} s for the evaluators of node{} {} to join before the run starts ({} running)",
               args.join_wait_s, st.awaited.size() > 1 ? "s" : "", node_list(st.awaited), st.evaluators_alive);
    self->delayed_send(self, std::chrono::milliseconds(static_cast<int64_t>(args.join_wait_s * 1000)), tick_atom::value,
                       plan_atom::value);
    return st.done;
  }
  start(self, args);
  return st.done;
}

// A remote evaluator registered (its id is NODE/DEVICE): its node is no longer awaited; the run
// starts when it was the last.
void evaluator_joined(self_ptr self, const SupervisorArgs& args, const caf::actor& ev, const std::string& id) {
  auto lg = log::get("supervisor");
  auto& st = self->state;
  self->monitor(ev);
  ++st.evaluators_alive;
  lg->info("evaluator {} joined ({} running)", id, st.evaluators_alive);
  if (st.awaited.erase(evaluator_node(id)) == 0 || !st.awaited.empty() || !st.start_deferred) return;
  st.start_deferred = false;
  if (st.finished) return;
  lg->info("every listed evaluator node has joined; the run starts with {} evaluators", st.evaluators_alive);
  start(self, args);
}

// The deadline for the listed evaluator nodes: the run starts with the evaluators it has.
void evaluator_nodes_deadline(self_ptr self, const SupervisorArgs& args) {
  auto& st = self->state;
  if (!st.start_deferred || st.finished) return;
  st.start_deferred = false;
  log::get("supervisor")
      ->warn(
          "node{} {} brought no evaluator within {:g} s ([cluster] join_wait_s); the run starts with {} "
          "evaluators (a node that joins later takes its share then)",
          st.awaited.size() > 1 ? "s" : "", node_list(st.awaited), args.join_wait_s, st.evaluators_alive);
  start(self, args);
}

// A learner node's learner and selector, registered through the gate.
void learner_joined(self_ptr self, const SupervisorArgs& args, caf::actor l, caf::actor sel, const std::string& node) {
  auto lg = log::get("supervisor");
  auto& st = self->state;
  if (st.finished || !l) return;
  if (st.learner || args.learner_node.empty()) {
    lg->warn("a learner from node {} registered, but this run has its learner: ignored", node);
    return;
  }
  st.learner = caf::actor_cast<learner_actor>(std::move(l));      // crossed the network untyped
  st.selector = caf::actor_cast<selector_actor>(std::move(sel));  // crossed the network untyped
  self->monitor(st.learner);
  lg->info("the learner of node {} joined", node);
  if (st.start_waits) start(self, args);  // else the plan has not come yet: start() finds it
}

// A sampler join deadline (the n-th): the run ends when no sampler joined and samples wait.
void sampler_deadline(self_ptr self, const SupervisorArgs& args, uint64_t n) {
  auto& st = self->state;
  if (n != st.sampler_waits) return;
  st.sampler_deadline = false;
  if (st.finished || st.pool.alive() > 0) return;
  if (st.pool.waiting() == 0 && !st.sample_all_waits) return;
  std::string refused;
  for (auto& r : st.refused_samplers) refused += (refused.empty() ? "; refused: " : ", ") + r;
  finish(self, args,
         fmt::format("no sampler joined within {:g} s ([cluster] join_wait_s); {} samples were not sampled{}",
                     args.join_wait_s, st.experiment->outstanding(), refused));
}

// A scored sample: stored (once: a second copy is dropped), then handed to the experiment.
void record_scored(self_ptr self, const SupervisorArgs& args, ScoredRollout& s) {
  auto lg = log::get("supervisor");
  auto& st = self->state;
  if (!st.store) return;
  if (st.finished) {  // an evaluation that ended with the run (an interrupted run's, say): no verdict of it
    lg->debug("sample {} arrived after the run ended; not recorded", s.rollout.sample_id);
    return;
  }
  switch (st.store->record_sample(args.experiment.run_id, s)) {
    case InsertResult::duplicate:
      ++st.duplicates;
      lg->warn("sample {} arrived twice; the second copy is dropped", s.rollout.sample_id);
      return;
    case InsertResult::failed:
      ++st.store_failures;
      lg->error("store: cannot record sample {}: {}", s.rollout.sample_id, st.store->last_error());
      break;
    case InsertResult::inserted:
      break;
  }
  st.pool.arrived(s.rollout.task_id, s.rollout.group_id, s.rollout.sample_index);
  apply(self, args, st.experiment->sampled(s));
}

supervisor_actor::behavior_type supervisor_behavior(self_ptr self, SupervisorArgs args) {
  auto lg = log::get("supervisor");
  std::string err;
  auto& st0 = self->state;
  st0.learner = args.learner;
  st0.selector = args.selector;
  st0.experiment = make_experiment(args.experiment);
  if (args.join_wait_s > 0) st0.awaited.insert(args.evaluator_nodes.begin(), args.evaluator_nodes.end());
  st0.store = Store::open(args.store_path, args.synchronous, err);
  if (!st0.store)
    lg->error("{}", err);
  else if (!st0.store->begin_run(args.experiment.run_id, name(args.experiment.mode), args.config_toml))
    lg->error("store: cannot begin run: {}", st0.store->last_error());
  log_unexpected_messages(self, "supervisor");
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    if (st.learner && dm.source == st.learner.address()) {  // the learner node's (the only one watched)
      learner_lost(self, args, self->system().render(dm.reason));
      return;
    }
    for (size_t i = 0; i < st.samplers.size(); ++i)
      if (st.samplers[i].address() == dm.source) {
        sampler_lost(self, args, i, self->system().render(dm.reason));
        return;
      }
    if (st.evaluators_alive > 0) --st.evaluators_alive;
    if (st.evaluators_alive == 0)
      none_left(self, args,
                fmt::format("no evaluator is running (see the errors above); {} samples have no verdict",
                            st.experiment->outstanding()));
  });
  return {
      [=](plan_atom, std::vector<caf::actor> samplers, std::vector<caf::actor> evaluators) {
        return plan(self, args, as_typed<sampler_actor>(samplers), evaluators, err);
      },
      [=](register_atom, sampler_atom, caf::actor s, const std::string& name) {  // from the gate
        sampler_joined(self, args, caf::actor_cast<sampler_actor>(s), name);
      },
      [=](register_atom, learner_atom, caf::actor l, caf::actor sel, const std::string& node) {  // from the gate
        learner_joined(self, args, std::move(l), std::move(sel), node);
      },
      [=](tick_atom, learner_atom) {  // the learner join deadline
        auto& st = self->state;
        if (st.finished || st.learner) return;
        finish(self, args,
               fmt::format("the learner of node {} did not join within {:g} s ([cluster] join_wait_s): start it with "
                           "`launch CONFIG --node {}`",
                           args.learner_node, args.join_wait_s, args.learner_node));
      },
      [=](tick_atom, sampler_atom, uint64_t n) { sampler_deadline(self, args, n); },
      [=](register_atom, caf::actor ev, const std::string& id) {  // from the gate: a remote evaluator
        evaluator_joined(self, args, ev, id);
      },
      [=](tick_atom, plan_atom) { evaluator_nodes_deadline(self, args); },
      [=](tick_atom, uint64_t n) {  // a join deadline
        auto& st = self->state;
        if (n == st.waits && st.evaluators_alive == 0 && !st.finished)
          finish(self, args,
                 fmt::format("no evaluator joined within {:g} s; {} samples have no verdict", args.join_wait_s,
                             st.experiment->outstanding()));
      },
      [=](record_atom, ScoredRollout& s) { record_scored(self, args, s); },
      [=](interrupt_atom, const std::string& why) { finish(self, args, why, true); },
      [=](record_atom, Telemetry& t) {
        auto& st = self->state;
        if (st.store && !st.store->record_telemetry(args.experiment.run_id, t))
          lg->warn("store: cannot record telemetry: {}", st.store->last_error());
      },
      [=](stats_atom) {
        auto& st = self->state;
        Telemetry t;
        t.ts = now_s();
        t.source = "supervisor";
        t.values = st.experiment->telemetry();
        t.values["evaluators_alive"] = double(st.evaluators_alive);
        t.values["samplers_alive"] = double(st.pool.alive());
        t.step = st.experiment->totals().step;
        return t;
      },
  };
}

}  // namespace

supervisor_actor spawn_supervisor(caf::actor_system& sys, SupervisorArgs args) {
  return sys.spawn(supervisor_behavior, std::move(args));
}

}  // namespace kernelrl

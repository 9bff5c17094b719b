// The dispatcher and evaluators as actors (the learner's and selector's tests: train_actors_test.cpp).
#include "actors/dispatcher.hpp"
#include "actors/evaluator.hpp"
#include "actors/monitor.hpp"
#include "core/log.hpp"
#include "messages/messages.hpp"
#include "actor_system.hpp"

#include <caf/all.hpp>
#include <catch2/catch.hpp>
#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

using namespace kernelrl;

using test::System;

// The dispatcher in front of synthetic evaluators of two nodes: every sample comes back scored
// once, and its telemetry splits evaluators, answers and utilisation by node.
namespace {
// The reward's stand-in: reward_actor's interface, and the count of what it was sent.
using scores_actor = reward_actor::extend<caf::replies_to<stats_atom>::with<uint64_t>>;

scores_actor::behavior_type collect_scores(scores_actor::stateful_pointer<std::vector<std::string>> self) {
  return {
      [=](score_atom, Rollout& r, EvalResult& e) {
        CHECK(e.sample_id == r.sample_id);
        CHECK(e.device == "synthetic");
        self->state.push_back(r.sample_id);
      },
      [=](stats_atom) -> uint64_t { return self->state.size(); },
  };
}

// Sample i of task "t".
Rollout test_rollout(int i) {
  Rollout r;
  r.task_id = "t";
  r.sample_index = i;
  r.sample_id = make_sample_id("t", 0, i);
  return r;
}

void send_rollouts(caf::scoped_actor& self, const dispatcher_actor& dispatcher, int n) {
  for (int i = 0; i < n; ++i) self->send(dispatcher, test_rollout(i));
}

// Samples scored so far, once n are or after `seconds`.
uint64_t wait_scored(caf::scoped_actor& self, const scores_actor& scores, int n, int seconds) {
  uint64_t got = 0;
  for (int tries = 0; tries < seconds * 100 && got < uint64_t(n); ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    self->request(scores, std::chrono::seconds(5), stats_atom::value)
        .receive([&](uint64_t k) { got = k; }, [](caf::error&) {});
  }
  return got;
}
// Synthetic evaluators registered with `dispatcher`, each answering after `latency_ms`.
std::vector<caf::actor> synthetic_evaluators(System& s, const dispatcher_actor& dispatcher,
                                             std::initializer_list<const char*> ids, double latency_ms) {
  std::vector<caf::actor> evs;
  for (auto* id : ids) {
    EvaluatorArgs ea;
    ea.id = id;
    ea.settings.backend = "synthetic";
    ea.settings.synthetic_latency_ms = latency_ms;
    evs.push_back(caf::actor_cast<caf::actor>(spawn_evaluator(*s.sys, ea, caf::actor_cast<caf::actor>(dispatcher))));
  }
  return evs;
}
}  // namespace

TEST_CASE("the dispatcher balances synthetic evaluators of two nodes and reports each node", "[actors]") {
  System s;
  auto scores = s.sys->spawn(collect_scores);
  DispatcherArgs da;
  da.task_paths["t"] = "/nonexistent/t.py";  // synthetic evaluators never read it
  da.max_in_flight = 2;
  auto dispatcher = spawn_dispatcher(*s.sys, da, scores);
  auto evs = synthetic_evaluators(s, dispatcher, {"n1/cpu-0", "n1/cpu-1", "n2/cpu-0"}, 2);
  caf::scoped_actor self{*s.sys};
  const int n = 90;
  send_rollouts(self, dispatcher, n);
  REQUIRE(wait_scored(self, scores, n, 5) == uint64_t(n));
  self->request(dispatcher, std::chrono::seconds(5), stats_atom::value)
      .receive(
          [&](Telemetry& t) {
            CHECK(t.values["completed"] == n);
            CHECK(t.values["node.n1.evaluators"] == 2);
            CHECK(t.values["node.n2.evaluators"] == 1);
            CHECK(t.values["node.n1.capacity"] == 4);
            CHECK(t.values["node.n1.completed"] + t.values["node.n2.completed"] == n);
            // Equal latency, least-loaded first: each evaluator gets about a third.
            CHECK(t.values["node.n2.completed"] >= n / 3 - 10);
            CHECK(t.values["node.n1.completed"] >= 2 * n / 3 - 10);
            CHECK(t.values["duplicates_dropped"] == 0);
          },
          [](caf::error&) { FAIL("no dispatcher stats"); });
  for (auto& a : evs) self->send_exit(a, caf::exit_reason::user_shutdown);
  self->send_exit(dispatcher, caf::exit_reason::user_shutdown);
  self->send_exit(scores, caf::exit_reason::user_shutdown);
}

// A training step's groups, as the sampler sends them: 8 samples of each of 6 tasks, in order, to
// two evaluators. A task's reference is timed once per device of a node (a site); least-loaded
// alone sends every task to both evaluators (12 task x site pairs: 12 reference timings); with task
// affinity each site keeps to its own tasks, and two evaluators of one site keep the queue's order.
namespace {
Telemetry affinity_run(std::initializer_list<const char*> ids, int tasks, int group) {
  System s;
  auto scores = s.sys->spawn(collect_scores);
  DispatcherArgs da;
  for (int t = 0; t < tasks; ++t) da.task_paths["t" + std::to_string(t)] = "/nonexistent/t.py";
  auto dispatcher = spawn_dispatcher(*s.sys, da, scores);
  auto evs = synthetic_evaluators(s, dispatcher, ids, 3);
  caf::scoped_actor self{*s.sys};
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // both registered
  for (int t = 0; t < tasks; ++t)
    for (int i = 0; i < group; ++i) {
      Rollout r;
      r.task_id = "t" + std::to_string(t);
      r.sample_index = i;
      r.sample_id = make_sample_id(r.task_id, 0, i);
      self->send(dispatcher, r);
    }
  REQUIRE(wait_scored(self, scores, tasks * group, 10) == uint64_t(tasks * group));
  Telemetry out;
  self->request(dispatcher, std::chrono::seconds(5), stats_atom::value)
      .receive([&](Telemetry& t) { out = t; }, [](caf::error&) { FAIL("no dispatcher stats"); });
  for (auto& a : evs) self->send_exit(a, caf::exit_reason::user_shutdown);
  self->send_exit(dispatcher, caf::exit_reason::user_shutdown);
  self->send_exit(scores, caf::exit_reason::user_shutdown);
  return out;
}
}  // namespace

TEST_CASE("a task's samples go to the node and device that already has its reference", "[actors]") {
  const int tasks = 6, group = 8;
  SECTION("two nodes") {
    auto t = affinity_run({"n1/cpu-0", "n2/cpu-0"}, tasks, group);
    // Each task on one site, but for the first (both take it while the queue fills) and the last
    // ones (both sites finish them together).
    CHECK(t.values["task_sites"] <= tasks + 3);
    CHECK(t.values["task_sites"] >= tasks);
    // Neither node idles for it.
    CHECK(t.values["node.n1.completed"] >= tasks * group / 3);
    CHECK(t.values["node.n2.completed"] >= tasks * group / 3);
    CHECK(t.values["completed"] == tasks * group);
  }
  SECTION("two GPUs of one node") {
    auto t = affinity_run({"n1/cuda:0", "n1/cuda:1"}, tasks, group);
    CHECK(t.values["task_sites"] <= tasks + 3);
    CHECK(t.values["completed"] == tasks * group);
  }
  SECTION("two evaluators sharing one GPU, or a node's CPU slots: one site") {
    CHECK(affinity_run({"n1/cuda:0", "n1/cuda:0#2"}, tasks, group).values["task_sites"] == tasks);
    CHECK(affinity_run({"n1/cpu-0", "n1/cpu-1"}, tasks, group).values["task_sites"] == tasks);
  }
}

TEST_CASE("an idle evaluator takes the work waiting behind a slow one", "[actors]") {
  System s;
  auto scores = s.sys->spawn(collect_scores);
  DispatcherArgs da;
  da.task_paths["t"] = "/nonexistent/t.py";
  da.max_in_flight = 4;
  auto dispatcher = spawn_dispatcher(*s.sys, da, scores);
  caf::scoped_actor self{*s.sys};
  // The slow evaluator registers first and is handed 4 requests; then the fast one appears.
  EvaluatorArgs slow;
  slow.id = "slow/cpu-0";
  slow.settings.backend = "synthetic";
  slow.settings.synthetic_latency_ms = 1500;
  auto ev_slow = spawn_evaluator(*s.sys, slow, caf::actor_cast<caf::actor>(dispatcher));
  const int n = 8;
  send_rollouts(self, dispatcher, n);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EvaluatorArgs fast = slow;
  fast.id = "fast/cpu-0";
  fast.settings.synthetic_latency_ms = 1;
  auto ev_fast = spawn_evaluator(*s.sys, fast, caf::actor_cast<caf::actor>(dispatcher));
  REQUIRE(wait_scored(self, scores, n, 10) == uint64_t(n));
  self->request(dispatcher, std::chrono::seconds(5), stats_atom::value)
      .receive(
          [&](Telemetry& t) {
            // Only the request the slow one had started stays with it; the three queued behind
            // it were given back unstarted (not counted as failed attempts) and ran on the fast one.
            CHECK(t.values["node.slow.completed"] == 1);
            CHECK(t.values["node.fast.completed"] == n - 1);
            CHECK(t.values["withdrawn"] == 3);
            CHECK(t.values["redispatched"] == 0);
            CHECK(t.values["duplicates_dropped"] == 0);
          },
          [](caf::error&) { FAIL("no dispatcher stats"); });
  for (auto& a : {caf::actor_cast<caf::actor>(ev_slow), caf::actor_cast<caf::actor>(ev_fast),
                  caf::actor_cast<caf::actor>(dispatcher), caf::actor_cast<caf::actor>(scores)})
    self->send_exit(a, caf::exit_reason::user_shutdown);
}

// Hands n rollouts to the dispatcher as requests, all at once, and counts the answers.
caf::behavior producer(caf::stateful_actor<uint64_t>* self, dispatcher_actor dispatcher, int n) {
  for (int i = 0; i < n; ++i)
    self->request(dispatcher, caf::infinite, test_rollout(i)).then([=](bool) { ++self->state; }, [](caf::error&) {});
  return {[=](stats_atom) -> uint64_t { return self->state; }};
}

TEST_CASE("a full dispatcher queue holds its producers back until evaluators drain it", "[actors]") {
  System s;
  auto scores = s.sys->spawn(collect_scores);
  DispatcherArgs da;
  da.task_paths["t"] = "/nonexistent/t.py";
  da.max_queue = 4;
  auto dispatcher = spawn_dispatcher(*s.sys, da, scores);
  caf::scoped_actor self{*s.sys};
  const int n = 10;
  auto prod = s.sys->spawn(producer, dispatcher, n);
  auto answered = [&] {
    uint64_t k = 0;
    self->request(prod, std::chrono::seconds(5), stats_atom::value)
        .receive([&](uint64_t v) { k = v; }, [](caf::error&) {});
    return k;
  };
  // No evaluator yet: the queue takes 4 and answers them; the other 6 producers wait.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(answered() == 4);
  EvaluatorArgs ea;
  ea.id = "n/cpu-0";
  ea.settings.backend = "synthetic";
  ea.settings.synthetic_latency_ms = 1;
  auto ev = spawn_evaluator(*s.sys, ea, caf::actor_cast<caf::actor>(dispatcher));
  REQUIRE(wait_scored(self, scores, n, 10) == uint64_t(n));
  CHECK(answered() == uint64_t(n));
  for (auto& a : {caf::actor_cast<caf::actor>(ev), prod, caf::actor_cast<caf::actor>(dispatcher),
                  caf::actor_cast<caf::actor>(scores)})
    self->send_exit(a, caf::exit_reason::user_shutdown);
}

// The monitor sums its samplers' gauges; one that goes away keeps its counts in the sums but not
// its rate or queues; a sampler registered later (from another node) is asked too.
namespace {
caf::behavior fake_sampler_gauges(caf::event_based_actor*, std::string name, double rollouts, double rate) {
  return {[=](stats_atom) {
    Telemetry t;
    t.source = name;
    t.values = {{"rollouts", rollouts}, {"tokens_per_s", rate}, {"waiting", 2.0}};
    return t;
  }};
}

std::map<std::string, double> snapshot(caf::scoped_actor& self, const monitor_actor& monitor) {
  std::map<std::string, double> out;
  self->request(monitor, std::chrono::seconds(5), stats_atom::value)
      .receive([&](Telemetry& t) { out = t.values; }, [](caf::error&) { FAIL("no snapshot"); });
  return out;
}

bool eventually(const std::function<bool()>& cond) {
  for (int i = 0; i < 100; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return cond();
}
}  // namespace

TEST_CASE("the monitor sums samplers, forgets a gone one's rate, and asks a registered one", "[actors]") {
  System s;
  auto a = s.sys->spawn(fake_sampler_gauges, std::string("sampler-0"), 10.0, 100.0);
  auto b = s.sys->spawn(fake_sampler_gauges, std::string("sampler-1"), 5.0, 50.0);
  MonitorArgs ma;
  ma.progress = false;
  ma.interval_s = 0.05;
  auto monitor = spawn_monitor(*s.sys, ma, {caf::actor_cast<telemetry_source>(a), caf::actor_cast<telemetry_source>(b)},
                               telemetry_recorder{});
  caf::scoped_actor self{*s.sys};
  CHECK(eventually([&] { return snapshot(self, monitor)["sampler.tokens_per_s"] == 150.0; }));
  CHECK(snapshot(self, monitor)["sampler.rollouts"] == 15.0);
  self->send_exit(b, caf::exit_reason::kill);
  CHECK(eventually([&] { return snapshot(self, monitor)["sampler.tokens_per_s"] == 100.0; }));
  auto m = snapshot(self, monitor);
  CHECK(m["sampler.rollouts"] == 15.0);  // its rollouts happened
  CHECK(m["sampler.waiting"] == 2.0);    // its queue is gone
  auto c = s.sys->spawn(fake_sampler_gauges, std::string("sampler-gen-0"), 1.0, 7.0);
  self->send(monitor, register_atom::value, c, std::string("sampler-gen-0"));
  CHECK(eventually([&] { return snapshot(self, monitor)["sampler.tokens_per_s"] == 107.0; }));
  CHECK(snapshot(self, monitor)["sampler-gen-0.rollouts"] == 1.0);
  for (auto& x : {a, c, caf::actor_cast<caf::actor>(monitor)}) self->send_exit(x, caf::exit_reason::user_shutdown);
}

TEST_CASE("the monitor answers a message it has no handler for with an error, logs it and keeps running", "[actors]") {
  System s;
  std::ostringstream logged;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(logged);
  log::get("monitor")->sinks().push_back(sink);
  MonitorArgs ma;
  ma.progress = false;
  ma.interval_s = 0.05;
  auto monitor = spawn_monitor(*s.sys, ma, {}, telemetry_recorder{});
  caf::scoped_actor self{*s.sys};
  caf::error got;
  // Its interface refuses this at compile time; a peer holds only a dynamically typed handle.
  self->request(caf::actor_cast<caf::actor>(monitor), std::chrono::seconds(5), std::string("a stray request"))
      .receive([](const caf::message&) { FAIL("the monitor took a string"); }, [&](caf::error& e) { got = e; });
  CHECK(got == caf::sec::unexpected_message);
  CHECK(logged.str().find("dropped an unexpected message") != std::string::npos);
  CHECK(logged.str().find("a stray request") != std::string::npos);
  snapshot(self, monitor);  // still answers (FAILs otherwise)
  auto& sinks = log::get("monitor")->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
  self->send_exit(monitor, caf::exit_reason::user_shutdown);
}

TEST_CASE("a progress line made to fit 80 columns keeps where the run is and its ETA", "[monitor]") {
  const std::string line =
      "[rl] step 3/10 | 256 samples | fast_1 last step 0.25 | reward 0.312 | loss 0.0123 | entropy 0.456 | "
      "policy v3 | 3.42 samples/s | queue 0 | in flight 12 | ETA 1m23s";
  auto fit = fit_progress(line, 79);
  CHECK(fit.size() <= 79);
  CHECK(fit.rfind("[rl] step 3/10 | ", 0) == 0);
  REQUIRE(fit.size() >= 12);
  CHECK(fit.substr(fit.size() - 12) == " | ETA 1m23s");
  CHECK(fit.find("samples/s") != std::string::npos);  // more useful than the queue, kept while it fits
  CHECK(fit.find("queue") == std::string::npos);
  CHECK(fit_progress(line, 500) == line);
  auto tiny = fit_progress(line, 20);
  CHECK(tiny.size() == 20);
  CHECK(tiny.rfind("[rl] step 3/10", 0) == 0);
}

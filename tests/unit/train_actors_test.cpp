// The learner, checkpoint-selector and supervisor actors of a train run, with a scripted learner
// engine and scripted samplers: streaming groups into one update per step, weight sync that must
// be acknowledged (a silent or refusing sampler stops the step), checkpoint retention and best
// so far, and the supervisor rejecting stale samples and sampling their task again.
#include "actors/checkpoint_selector.hpp"
#include "actors/learner.hpp"
#include "actors/supervisor.hpp"
#include "experiment/adaptation.hpp"
#include "learner/lora_learner.hpp"
#include "messages/messages.hpp"
#include "store/store.hpp"
#include "actor_system.hpp"

#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include <cmath>
#include <nlohmann/json.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

namespace fs = std::filesystem;
using namespace kernelrl;
using test::System;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("kernelrl-learner-test-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// Records what it is given; an update's "loss" is the number of groups learned in the step.
struct ScriptedEngine : LearnerEngine {
  mutable std::mutex mu;
  std::vector<std::vector<LearnSample>> groups;
  uint64_t v = 0, in_step = 0;
  GroupOutcome add_group(const std::vector<LearnSample>& g) override {
    std::lock_guard lk(mu);
    groups.push_back(g);
    ++in_step;
    GroupOutcome o;
    o.advantages.assign(g.size(), 0.0);
    return o;
  }
  UpdateStats step() override {
    std::lock_guard lk(mu);
    UpdateStats u;
    u.version = ++v;
    u.loss = double(in_step);
    u.applied = true;
    in_step = 0;
    return u;
  }
  uint64_t version() const override {
    std::lock_guard lk(mu);
    return v;
  }
  std::vector<TensorBlob> adapter_blobs() const override { return {TensorBlob{"w", "f32", {1}, {0, 0, 128, 63}}}; }
  void save_checkpoint(const std::string& dir) const override {
    fs::create_directories(dir);
    std::ofstream(fs::path(dir) / "learner.json") << "{\"version\": " << version() << "}\n";
  }
  void load_checkpoint(const std::string&) override { throw LearnerError("scripted engine: no checkpoints"); }
  size_t n_groups() const {
    std::lock_guard lk(mu);
    return groups.size();
  }
};

// A sampler that acknowledges weights (behaviour "ok"), never answers ("mute") or refuses.
struct fake_sampler_state {
  std::vector<uint64_t> versions;
};
caf::behavior fake_sampler(caf::stateful_actor<fake_sampler_state>* self, std::string behaviour) {
  return {
      [=](WeightsUpdate& u) -> caf::result<uint64_t> {
        self->state.versions.push_back(u.version);
        if (behaviour == "mute") return self->make_response_promise<uint64_t>();  // never delivered
        if (behaviour == "refuse") return caf::make_error(caf::sec::runtime_error, "adapter rank does not match");
        return u.version;
      },
      [=](stats_atom) { return self->state.versions; },
  };
}

ScoredRollout sample(uint32_t step, uint64_t group, uint32_t i, const std::string& task, uint64_t version,
                     double reward) {
  ScoredRollout s;
  s.rollout.task_id = task;
  s.rollout.step = step;
  s.rollout.group_id = group;
  s.rollout.sample_index = i;
  s.rollout.sample_id = make_sample_id(task, group, i);
  s.rollout.prompt = "p";
  s.rollout.token_ids = {1, 2};
  s.rollout.logprobs = {-0.5f, -0.25f};
  s.rollout.policy_version = version;
  s.result.sample_id = s.rollout.sample_id;
  s.result.task_id = task;
  s.result.status = reward > 0 ? EvalStatus::ok : EvalStatus::incorrect;
  s.result.speedup = reward;
  s.reward = reward;
  return s;
}

// A learner actor over `engine`, checkpoints under `tmp`.
learner_actor scripted_learner(System& s, const TempDir& tmp, std::shared_ptr<ScriptedEngine> engine,
                               double sync_timeout_s) {
  LearnerArgs la;
  la.engine = std::move(engine);
  la.checkpoint_dir = (tmp.path / "checkpoints").string();
  la.sync_timeout_s = sync_timeout_s;
  return spawn_learner(*s.sys, la);
}

std::vector<uint64_t> versions_of(caf::scoped_actor& self, const caf::actor& sampler) {
  std::vector<uint64_t> out;
  self->request(sampler, std::chrono::seconds(5), stats_atom::value)
      .receive([&](std::vector<uint64_t>& v) { out = v; }, [](caf::error&) { FAIL("no answer"); });
  return out;
}

// The learner starts serving `samplers` at policy version 0.
void sync_at_version_0(caf::scoped_actor& self, const learner_actor& learner, std::vector<caf::actor> samplers) {
  self->request(learner, std::chrono::seconds(5), sync_atom::value, std::move(samplers))
      .receive([](uint64_t v) { CHECK(v == 0); }, [](caf::error&) { FAIL("sync failed"); });
}

}  // namespace

TEST_CASE("the learner learns each group as it completes and publishes one version per step", "[learner]") {
  System s;
  TempDir tmp;
  auto engine = std::make_shared<ScriptedEngine>();
  auto learner = scripted_learner(s, tmp, engine, 5);
  auto sampler = s.sys->spawn(fake_sampler, std::string("ok"));
  caf::scoped_actor self{*s.sys};
  sync_at_version_0(self, learner, {sampler});
  CHECK(fs::exists(tmp.path / "checkpoints" / "step-0" / "learner.json"));

  auto h = self->request(learner, std::chrono::seconds(10), plan_atom::value, uint32_t{0}, uint64_t{2});
  self->send(learner, train_atom::value, sample(0, 0, 0, "a", 0, 1.0), false);
  self->send(learner, train_atom::value, sample(0, 0, 1, "a", 0, 0.0), true);
  // A group of the next step arrives early: it waits for step 0's update.
  self->send(learner, train_atom::value, sample(1, 7, 0, "c", 0, 1.0), false);
  self->send(learner, train_atom::value, sample(1, 7, 1, "c", 0, 0.0), true);
  // The first group is learned from before the step's last group exists (streaming).
  self->request(learner, std::chrono::seconds(5), stats_atom::value)
      .receive(
          [](Telemetry& t) {
            CHECK(t.values["groups_learned"] == 1);
            CHECK(t.values["updates"] == 0);
          },
          [](caf::error&) { FAIL("no stats"); });
  CHECK(engine->n_groups() == 1);
  self->send(learner, train_atom::value, sample(0, 1, 0, "b", 0, 0.5), false);
  self->send(learner, train_atom::value, sample(0, 1, 1, "b", 0, 0.0), true);
  h.receive(
      [&](StepUpdate& u) {
        CHECK(u.error.empty());
        CHECK(u.step == 0);
        CHECK(u.policy_version == 1);
        CHECK(u.stats["loss"] == 2);  // both groups of step 0, not the early one of step 1
        CHECK(u.checkpoint == (tmp.path / "checkpoints" / "step-1").string());
      },
      [](caf::error& e) { FAIL("step failed"); });
  CHECK(versions_of(self, sampler) == std::vector<uint64_t>{0, 1});
  self->request(learner, std::chrono::seconds(10), plan_atom::value, uint32_t{1}, uint64_t{1})
      .receive(
          [](StepUpdate& u) {
            CHECK(u.policy_version == 2);
            CHECK(u.stats["loss"] == 1);
          },
          [](caf::error&) { FAIL("step 1 failed"); });
  CHECK(engine->n_groups() == 3);
  CHECK(engine->groups[2].front().reward == 1.0);
  CHECK(engine->groups[2].front().logprobs == std::vector<float>{-0.5f, -0.25f});
  self->send_exit(learner, caf::exit_reason::user_shutdown);
  self->send_exit(sampler, caf::exit_reason::user_shutdown);
}

TEST_CASE("a sampler that joins gets the current version first, then every later one", "[learner]") {
  System s;
  TempDir tmp;
  auto engine = std::make_shared<ScriptedEngine>();
  auto learner = scripted_learner(s, tmp, engine, 5);
  auto first = s.sys->spawn(fake_sampler, std::string("ok"));
  caf::scoped_actor self{*s.sys};
  sync_at_version_0(self, learner, {first});
  auto h = self->request(learner, std::chrono::seconds(10), plan_atom::value, uint32_t{0}, uint64_t{1});
  self->send(learner, train_atom::value, sample(0, 0, 0, "a", 0, 1.0), false);
  self->send(learner, train_atom::value, sample(0, 0, 1, "a", 0, 0.0), true);
  h.receive([](StepUpdate& u) { CHECK(u.policy_version == 1); }, [](caf::error&) { FAIL("step failed"); });
  // A sampler joins at version 1: it is sent version 1 alone, answered once it acknowledged.
  auto late = s.sys->spawn(fake_sampler, std::string("ok"));
  self->request(learner, std::chrono::seconds(5), sync_atom::value, late, std::string("sampler-gen-0"))
      .receive([](uint64_t v) { CHECK(v == 1); }, [](caf::error&) { FAIL("join failed"); });
  CHECK(versions_of(self, late) == std::vector<uint64_t>{1});
  CHECK(versions_of(self, first) == std::vector<uint64_t>{0, 1});
  // A joiner that refuses the weights is an error for its join only.
  auto refusing = s.sys->spawn(fake_sampler, std::string("refuse"));
  self->request(learner, std::chrono::seconds(5), sync_atom::value, refusing, std::string("sampler-bad-0"))
      .receive([](uint64_t) { FAIL("a refused version was taken as published"); },
               [&](caf::error& e) {
                 CHECK(error_text(*s.sys, e).find("sampler-bad-0 did not take policy version 1") != std::string::npos);
               });
  // (it stays alive: were it still served, it would refuse the next version and fail the step)
  // A sampler that never answers dies while the next version waits for it: dropped, the step
  // completes with the others (the learner watches its samplers).
  auto mute = s.sys->spawn(fake_sampler, std::string("mute"));
  self->request(learner, std::chrono::milliseconds(300), sync_atom::value, mute, std::string("sampler-mute-0"))
      .receive([](uint64_t) { FAIL("a mute sampler acknowledged"); }, [](caf::error&) {});
  h = self->request(learner, std::chrono::seconds(10), plan_atom::value, uint32_t{1}, uint64_t{1});
  self->send(learner, train_atom::value, sample(1, 1, 0, "b", 1, 1.0), false);
  self->send(learner, train_atom::value, sample(1, 1, 1, "b", 1, 0.0), true);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  self->send_exit(mute, caf::exit_reason::kill);
  h.receive(
      [](StepUpdate& u) {
        CHECK(u.error.empty());
        CHECK(u.policy_version == 2);
      },
      [](caf::error&) { FAIL("step 1 failed"); });
  CHECK(versions_of(self, late) == std::vector<uint64_t>{1, 2});
  CHECK(versions_of(self, first) == std::vector<uint64_t>{0, 1, 2});
  self->send_exit(learner, caf::exit_reason::user_shutdown);
  self->send_exit(first, caf::exit_reason::user_shutdown);
  self->send_exit(late, caf::exit_reason::user_shutdown);
  self->send_exit(refusing, caf::exit_reason::user_shutdown);
}

TEST_CASE("a weight sync that is not acknowledged stops the step with an error", "[learner]") {
  for (std::string behaviour : {"mute", "refuse"}) {
    System s;
    TempDir tmp;
    auto learner = scripted_learner(s, tmp, std::make_shared<ScriptedEngine>(), 0.3);
    auto good = s.sys->spawn(fake_sampler, std::string("ok"));
    auto bad = s.sys->spawn(fake_sampler, behaviour);
    caf::scoped_actor self{*s.sys};
    std::string err;
    self->request(learner, std::chrono::seconds(5), sync_atom::value, std::vector<caf::actor>{good, bad})
        .receive([](uint64_t) {}, [&](caf::error& e) { err = error_text(*s.sys, e); });
    INFO(behaviour << ": " << err);
    CHECK(err.find("sampler-1 did not take policy version 0") != std::string::npos);
    if (behaviour == "mute")
      CHECK(err.find("no acknowledgement within 0.3 s") != std::string::npos);
    else
      CHECK(err.find("adapter rank does not match") != std::string::npos);
    auto h = self->request(learner, std::chrono::seconds(10), plan_atom::value, uint32_t{0}, uint64_t{1});
    self->send(learner, train_atom::value, sample(0, 0, 0, "a", 0, 1.0), false);
    self->send(learner, train_atom::value, sample(0, 0, 1, "a", 0, 0.0), true);
    h.receive([&](StepUpdate& u) { CHECK(u.error.find("did not take policy version 1") != std::string::npos); },
              [](caf::error&) { FAIL("expected a StepUpdate carrying the error"); });
    for (auto& a : {caf::actor_cast<caf::actor>(learner), good, bad})
      self->send_exit(a, caf::exit_reason::user_shutdown);
  }
}

TEST_CASE("profiling rejection sampling takes lazy correct samples out of their groups, counted per step",
          "[learner]") {
  // Which samples go: correct ones measured below the threshold; never unmeasured or wrong ones.
  auto covered = [](double reward, double coverage, const std::string& task = "a", uint32_t i = 0) {
    auto x = sample(0, 0, i, task, 0, reward);
    x.result.kernel_coverage = coverage;
    return x;
  };
  CHECK(rejected_for_coverage(covered(2.0, 0.1), 0.3, 0, 0));
  CHECK_FALSE(rejected_for_coverage(covered(2.0, 0.5), 0.3, 0, 0));
  CHECK_FALSE(rejected_for_coverage(covered(2.0, -1), 0.3, 0, 0));   // not measured (a CPU evaluation)
  CHECK_FALSE(rejected_for_coverage(covered(0.0, 0.1), 0.3, 0, 0));  // wrong: nothing to reject
  CHECK_FALSE(rejected_for_coverage(covered(2.0, 0.1), 0, 0, 0));    // off
  // Kept with a probability: about that share of many lazy samples stays, the same ones each time.
  int kept = 0;
  for (uint32_t i = 0; i < 2000; ++i) {
    const bool r = rejected_for_coverage(covered(2.0, 0.1, "t", i), 0.3, 0.25, 7);
    CHECK(r == rejected_for_coverage(covered(2.0, 0.1, "t", i), 0.3, 0.25, 7));
    kept += r ? 0 : 1;
  }
  CHECK(kept > 2000 * 0.25 - 4 * std::sqrt(2000 * 0.25 * 0.75));
  CHECK(kept < 2000 * 0.25 + 4 * std::sqrt(2000 * 0.25 * 0.75));

  System s;
  TempDir tmp;
  auto engine = std::make_shared<ScriptedEngine>();
  LearnerArgs la;
  la.engine = engine;
  la.checkpoint_dir = (tmp.path / "checkpoints").string();
  la.reject_coverage_below = 0.3;
  auto learner = spawn_learner(*s.sys, la);
  auto sampler = s.sys->spawn(fake_sampler, std::string("ok"));
  caf::scoped_actor self{*s.sys};
  sync_at_version_0(self, learner, {sampler});
  auto h = self->request(learner, std::chrono::seconds(10), plan_atom::value, uint32_t{0}, uint64_t{2});
  // Group 0: one lazy correct sample of three; group 1: two of three, leaving one: skipped.
  std::vector<ScoredRollout> g0 = {covered(2.0, 0.1, "a", 0), covered(1.5, 0.9, "a", 1), covered(0, -1, "a", 2)};
  std::vector<ScoredRollout> g1 = {covered(2.0, 0.05, "b", 0), covered(3.0, 0.2, "b", 1), covered(0, -1, "b", 2)};
  for (auto* g : {&g0, &g1})
    for (auto& x : *g) {
      x.rollout.group_id = g == &g0 ? 0 : 1;
      x.rollout.sample_id = make_sample_id(x.rollout.task_id, x.rollout.group_id, x.rollout.sample_index);
      self->send(learner, train_atom::value, x, x.rollout.sample_index == 2);  // its group's last
    }
  h.receive(
      [&](StepUpdate& u) {
        CHECK(u.error.empty());
        CHECK(u.stats["coverage_rejected"] == 3);
        CHECK(u.stats["groups_skipped"] == 1);
      },
      [](caf::error&) { FAIL("no step update"); });
  REQUIRE(engine->n_groups() == 1);
  CHECK(engine->groups[0].size() == 2);  // the lazy sample left group 0 before it was learned from
  CHECK(engine->groups[0][0].reward == 1.5);
  for (auto& a : {caf::actor_cast<caf::actor>(learner), sampler}) self->send_exit(a, caf::exit_reason::user_shutdown);
}

TEST_CASE("the checkpoint selector keeps step 0, the newest and the best, and answers the best", "[learner]") {
  System s;
  TempDir tmp;
  auto dir = tmp.path / "checkpoints";
  auto sel = spawn_checkpoint_selector(*s.sys, SelectorArgs{dir.string(), 2});
  caf::scoped_actor self{*s.sys};
  bool none = false;
  self->request(sel, std::chrono::seconds(5), best_atom::value)
      .receive([](Checkpoint&) {}, [&](caf::error&) { none = true; });
  CHECK(none);
  const std::vector<double> fast_1 = {0.1, 0.5, 0.3, 0.5, 0.2, 0.0};
  auto feed = [&](const selector_actor& selector, const fs::path& folder) {  // a checkpoint a step, then its score
    for (uint32_t k = 0; k < fast_1.size(); ++k) {
      auto p = folder / ("step-" + std::to_string(k));
      fs::create_directories(p);
      std::ofstream(p / "learner.json") << "{}";
      self->send(selector, Checkpoint{k, k, p.string(), -1});
      StepStats st;
      st.step = k;
      st.fast_1 = fast_1[k];
      self->send(selector, record_atom::value, st);
    }
  };
  feed(sel, dir);
  self->request(sel, std::chrono::seconds(5), best_atom::value)
      .receive(
          [&](Checkpoint& c) {
            CHECK(c.step == 1);
            CHECK(c.score == 0.5);
          },  // the earlier of two 0.5s
          [](caf::error&) { FAIL("no best"); });
  std::set<std::string> left;
  for (auto& d : fs::directory_iterator(dir)) left.insert(d.path().filename().string());
  CHECK(left == std::set<std::string>{"step-0", "step-1", "step-4", "step-5"});
  auto j = nlohmann::json::parse(std::ifstream(dir / "step-4" / "stats.json"));
  CHECK(j["fast_1"] == 0.2);
  self->send_exit(sel, caf::exit_reason::user_shutdown);
  // A new selector over the same folder (a resumed run) knows the scores already written.
  auto again = spawn_checkpoint_selector(*s.sys, SelectorArgs{dir.string(), 2});
  self->request(again, std::chrono::seconds(5), best_atom::value)
      .receive([&](Checkpoint& c) { CHECK(c.step == 1); }, [](caf::error&) { FAIL("no best after restart"); });
  self->send_exit(again, caf::exit_reason::user_shutdown);
  // keep_last = 0: every checkpoint stays (the NLL probe rescores under each).
  auto all_dir = tmp.path / "all";
  auto keep_all = spawn_checkpoint_selector(*s.sys, SelectorArgs{all_dir.string(), 0});
  feed(keep_all, all_dir);
  self->request(keep_all, std::chrono::seconds(5), best_atom::value)
      .receive([&](Checkpoint& c) { CHECK(c.step == 1); }, [](caf::error&) { FAIL("no best"); });
  size_t kept = 0;
  for (auto& d : fs::directory_iterator(all_dir)) kept += d.is_directory() ? 1 : 0;
  CHECK(kept == fast_1.size());
  self->send_exit(keep_all, caf::exit_reason::user_shutdown);
}

namespace {
// The supervisor as the fakes see it: an untyped handle, as a peer on another node holds it.
caf::actor untyped_supervisor(caf::actor_system& sys, SupervisorArgs args) {
  return caf::actor_cast<caf::actor>(spawn_supervisor(sys, std::move(args)));
}

// Sampler, evaluators and reward in one: answers a SamplePlan by recording scored samples at the
// supervisor. Its samples claim the version it was told to claim: `lie_once` makes the first
// group of step 1 claim version 0 (a sampler that did not really switch weights).
struct pipeline_state {
  uint64_t serving = 0;
  bool lied = false;
  std::vector<SamplePlan> plans;
};
caf::behavior fake_pipeline(caf::stateful_actor<pipeline_state>* self, caf::actor supervisor, bool lie_once) {
  return {
      [=](WeightsUpdate& u) -> uint64_t { return self->state.serving = u.version; },
      [=](SamplePlan& p) -> uint64_t {
        auto& st = self->state;
        st.plans.push_back(p);
        for (size_t k = 0; k < p.task_ids.size(); ++k) {
          uint64_t v = st.serving;
          if (lie_once && p.step == 1 && !st.lied) {
            v = 0;
            st.lied = true;
          }
          for (uint32_t i = 0; i < p.n; ++i)
            self->send(supervisor, record_atom::value,
                       sample(p.step, p.group_ids[k], i, p.task_ids[k], v, i == 0 ? 2.0 : 0.0));
        }
        return uint64_t(p.task_ids.size()) * p.n;
      },
      [=](stats_atom) { return uint64_t(self->state.plans.size()); },
  };
}

// A whole train or ttt run: the real learner actor (scripted engine) and supervisor, the fake
// pipeline as sampler, evaluators and reward. Returns the run summary.
struct ScriptedRun {
  System s;
  TempDir tmp;
  std::shared_ptr<ScriptedEngine> engine = std::make_shared<ScriptedEngine>();
  SupervisorArgs sa;
  ScriptedRun(const std::string& mode, uint32_t steps, uint32_t batch, uint32_t patience) {
    sa.experiment.run_id = "r";
    sa.experiment.run_dir = tmp.path.string();
    sa.store_path = (tmp.path / "store.sqlite").string();
    sa.experiment.mode = *parse_mode(mode);
    sa.experiment.task_ids = {"t1", "t2", "t3"};
    sa.experiment.steps = steps;
    sa.experiment.batch_size = batch;
    sa.experiment.group_size = 2;
    sa.experiment.patience = patience;
  }
  nlohmann::json run(bool lie) {
    auto learner = scripted_learner(s, tmp, engine, 300);
    sa.learner = learner;
    auto sup = untyped_supervisor(*s.sys, sa);
    auto pipe = s.sys->spawn(fake_pipeline, sup, lie);
    caf::scoped_actor self{*s.sys};
    nlohmann::json j;
    self->request(sup, std::chrono::seconds(20), plan_atom::value, std::vector<caf::actor>{pipe},
                  std::vector<caf::actor>{pipe})
        .receive([&](std::string& summary) { j = nlohmann::json::parse(summary); },
                 [](caf::error&) { FAIL("no summary"); });
    for (auto& a : {caf::actor_cast<caf::actor>(learner), sup, pipe})
      self->send_exit(a, caf::exit_reason::user_shutdown);
    return j;
  }
};
}  // namespace

TEST_CASE("the supervisor rejects stale groups, samples the task again and learns only fresh samples", "[learner]") {
  for (bool lie : {false, true}) {
    ScriptedRun r("train", 3, 2, 0);
    auto j = r.run(lie);
    auto& engine = r.engine;
    auto& sa = r.sa;
    INFO(j.dump());
    CHECK(j["ok"] == true);
    CHECK(j["policy_version"] == 3);
    CHECK(j["steps"].size() == 3);
    CHECK(j["stale_rejected"] == (lie ? 2 : 0));
    CHECK(j["groups_replanned"] == (lie ? 1 : 0));
    CHECK(j["samples"] == (lie ? 14 : 12));  // every sample is kept in the store ...
    CHECK(engine->n_groups() == 6);          // ... but only fresh groups are learned from
    for (auto& g : engine->groups) CHECK(g.size() == 2);
    for (auto& st : j["steps"]) CHECK(st["samples"] == 4);
    // Step s was sampled by version s: every learned sample is on-policy.
    std::string err;
    auto store = Store::open_readonly(sa.store_path, err);
    REQUIRE(store);
    for (auto& row : store->samples("r"))
      if (!(lie && row.record.rollout.step == 1 && row.record.rollout.policy_version == 0))
        CHECK(row.record.rollout.policy_version == row.record.rollout.step);
    // Task order: the same shuffle for a resumed run; every task appears once per epoch.
    std::set<size_t> epoch0;
    for (uint64_t i = 0; i < 3; ++i) epoch0.insert(train_task_index(7, 3, i));
    CHECK(epoch0 == std::set<size_t>{0, 1, 2});
  }
}

TEST_CASE("a ttt run adapts on every task each step and stops early without improvement", "[learner]") {
  ScriptedRun r("ttt", 10, 3, 2);
  auto j = r.run(false);  // the same fast_1 (0.5) every step
  auto& tmp = r.tmp;
  INFO(j.dump());
  CHECK(j["ok"] == true);
  CHECK(j["stopped_early"] == true);
  CHECK(j["steps"].size() == 3);  // step 0 is the best; steps 1 and 2 do not beat it
  CHECK(j["boa"]["step"] == 0);
  CHECK(j["boa"]["fast_1"] == 0.5);
  CHECK(j["boa"]["checkpoint"] == (tmp.path / "checkpoints" / "step-0").string());
  for (auto& st : j["steps"]) CHECK(st["samples"] == 6);  // all three tasks, every step
  CHECK(r.engine->n_groups() == 9);
}

// An eval run of tasks t1 and t2 in tmp.
SupervisorArgs eval_of_two_tasks(const TempDir& tmp) {
  SupervisorArgs sa;
  sa.experiment.run_id = "r";
  sa.experiment.run_dir = tmp.path.string();
  sa.store_path = (tmp.path / "store.sqlite").string();
  sa.experiment.mode = *parse_mode("eval");
  sa.experiment.task_ids = {"t1", "t2"};
  return sa;
}

TEST_CASE("an eval run whose sampler of every task goes away ends with an error, not a hang", "[learner]") {
  System s;
  TempDir tmp;
  SupervisorArgs sa = eval_of_two_tasks(tmp);
  auto sup = untyped_supervisor(*s.sys, sa);
  // The first sampler takes the plan of every task, answers, and dies before any sample arrives;
  // the second sampler and the evaluator idle.
  auto dying = s.sys->spawn([](caf::event_based_actor* self) -> caf::behavior {
    return {
        [=](plan_atom, uint32_t) -> uint64_t {
          self->send(self, tick_atom::value);
          return 2;
        },
        [=](tick_atom) { self->quit(caf::make_error(caf::sec::runtime_error, "its server is gone")); },
    };
  });
  auto idle = [](caf::event_based_actor*) -> caf::behavior { return {[](stats_atom) { return uint64_t(0); }}; };
  auto other = s.sys->spawn(idle), evaluator = s.sys->spawn(idle);
  caf::scoped_actor self{*s.sys};
  nlohmann::json j;
  self->request(sup, std::chrono::seconds(20), plan_atom::value, std::vector<caf::actor>{dying, other},
                std::vector<caf::actor>{evaluator})
      .receive([&](std::string& summary) { j = nlohmann::json::parse(summary); },
               [](caf::error&) { FAIL("no summary: the run hung"); });
  INFO(j.dump());
  CHECK(j["ok"] == false);
  CHECK(j["error"].get<std::string>().find("sampler-0, which was sampling every task, is gone") != std::string::npos);
  for (auto& a : {sup, other, evaluator}) self->send_exit(a, caf::exit_reason::user_shutdown);
}

TEST_CASE("a cluster run with no sampler of its own waits for one to join, or ends when none does", "[learner]") {
  System s;
  TempDir tmp;
  SupervisorArgs sa = eval_of_two_tasks(tmp);
  sa.join_wait_s = 0.5;
  auto idle = [](caf::event_based_actor*) -> caf::behavior { return {[](stats_atom) { return uint64_t(0); }}; };
  caf::scoped_actor self{*s.sys};
  SECTION("nobody joins") {
    auto sup = untyped_supervisor(*s.sys, sa);
    auto evaluator = s.sys->spawn(idle);
    nlohmann::json j;
    self->request(sup, std::chrono::seconds(20), plan_atom::value, std::vector<caf::actor>{},
                  std::vector<caf::actor>{evaluator})
        .receive([&](std::string& summary) { j = nlohmann::json::parse(summary); },
                 [](caf::error&) { FAIL("no summary: the run hung"); });
    INFO(j.dump());
    CHECK(j["ok"] == false);
    CHECK(j["error"].get<std::string>().find("no sampler joined within 0.5 s") != std::string::npos);
    for (auto& a : {sup, evaluator}) self->send_exit(a, caf::exit_reason::user_shutdown);
  }
  SECTION("a sampler joins (through the gate) and samples every task") {
    sa.join_wait_s = 30;
    auto sup = untyped_supervisor(*s.sys, sa);
    auto evaluator = s.sys->spawn(idle);
    // It answers the plan and stores both tasks' samples, as the dispatcher and reward would.
    auto joiner = s.sys->spawn([sup](caf::event_based_actor* self) -> caf::behavior {
      return {
          [=](plan_atom, uint32_t) -> uint64_t {
            self->send(sup, record_atom::value, sample(0, 0, 0, "t1", 0, 1.0));
            self->send(sup, record_atom::value, sample(0, 1, 0, "t2", 0, 0.0));
            return 2;
          },
      };
    });
    auto h = self->request(sup, std::chrono::seconds(20), plan_atom::value, std::vector<caf::actor>{},
                           std::vector<caf::actor>{evaluator});
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    self->send(sup, register_atom::value, sampler_atom::value, joiner, std::string("sampler-gen-0"));
    nlohmann::json j;
    h.receive([&](std::string& summary) { j = nlohmann::json::parse(summary); },
              [](caf::error&) { FAIL("no summary: the run hung"); });
    INFO(j.dump());
    CHECK(j["ok"] == true);
    CHECK(j["samples"] == 2);
    for (auto& a : {sup, evaluator, joiner}) self->send_exit(a, caf::exit_reason::user_shutdown);
  }
}

TEST_CASE("a cluster run starts once every listed evaluator node has joined or join_wait_s after the plan",
          "[learner]") {
  System s;
  TempDir tmp;
  SupervisorArgs sa = eval_of_two_tasks(tmp);
  sa.evaluator_nodes = {"gen", "spare"};
  auto idle = [](caf::event_based_actor*) -> caf::behavior { return {[](stats_atom) { return uint64_t(0); }}; };
  caf::scoped_actor self{*s.sys};
  auto planned = std::make_shared<std::atomic<int>>(0);
  auto sampler_of = [&](caf::actor sup) {
    return s.sys->spawn([sup, planned](caf::event_based_actor* self) -> caf::behavior {
      return {
          [=](plan_atom, uint32_t) -> uint64_t {
            ++*planned;
            self->send(sup, record_atom::value, sample(0, 0, 0, "t1", 0, 1.0));
            self->send(sup, record_atom::value, sample(0, 1, 0, "t2", 0, 0.0));
            return 2;
          },
      };
    });
  };
  auto finish = [&](auto& h) {
    nlohmann::json j;
    h.receive([&](std::string& summary) { j = nlohmann::json::parse(summary); },
              [](caf::error&) { FAIL("no summary: the run hung"); });
    return j;
  };
  SECTION("both join: the run starts with the last") {
    sa.join_wait_s = 30;
    auto sup = untyped_supervisor(*s.sys, sa);
    auto local = s.sys->spawn(idle), gen = s.sys->spawn(idle), spare = s.sys->spawn(idle);
    auto sampler = sampler_of(sup);
    auto h = self->request(sup, std::chrono::seconds(20), plan_atom::value, std::vector<caf::actor>{sampler},
                           std::vector<caf::actor>{local});
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    CHECK(*planned == 0);  // the head's own evaluator is not the cluster
    self->send(sup, register_atom::value, gen, std::string("gen/cuda:0"));
    self->send(sup, register_atom::value, gen, std::string("gen/cuda:0#2"));
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    CHECK(*planned == 0);  // "spare" still starting
    self->send(sup, register_atom::value, spare, std::string("spare/cpu-0"));
    auto j = finish(h);
    INFO(j.dump());
    CHECK(j["ok"] == true);
    CHECK(j["samples"] == 2);
    CHECK(*planned == 1);
    for (auto& a : {sup, local, gen, spare, sampler}) self->send_exit(a, caf::exit_reason::user_shutdown);
  }
  SECTION("one never joins: the run starts join_wait_s after the plan, with the evaluators it has") {
    sa.join_wait_s = 0.4;
    auto sup = untyped_supervisor(*s.sys, sa);
    auto local = s.sys->spawn(idle), gen = s.sys->spawn(idle);
    auto sampler = sampler_of(sup);
    const auto t0 = std::chrono::steady_clock::now();
    self->send(sup, register_atom::value, gen, std::string("gen/cuda:0"));  // before the plan came
    auto h = self->request(sup, std::chrono::seconds(20), plan_atom::value, std::vector<caf::actor>{sampler},
                           std::vector<caf::actor>{local});
    auto j = finish(h);
    INFO(j.dump());
    CHECK(j["ok"] == true);
    CHECK(j["samples"] == 2);
    CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(400));
    for (auto& a : {sup, local, gen, sampler}) self->send_exit(a, caf::exit_reason::user_shutdown);
  }
}

TEST_CASE("a learning run whose learner is on another node starts once it joins and ends when it dies", "[learner]") {
  ScriptedRun r("train", 3, 2, 0);
  r.sa.learner_node = "trainer";
  r.sa.join_wait_s = 30;
  caf::scoped_actor self{*r.s.sys};
  auto run = [&](caf::actor sup, caf::actor pipe, std::function<void()> meanwhile) {
    auto h = self->request(sup, std::chrono::seconds(30), plan_atom::value, std::vector<caf::actor>{pipe},
                           std::vector<caf::actor>{pipe});
    meanwhile();
    nlohmann::json j;
    h.receive([&](std::string& summary) { j = nlohmann::json::parse(summary); },
              [](caf::error&) { FAIL("no summary: the run hung"); });
    return j;
  };
  SECTION("it joins after the plan: the run waits, then learns every step") {
    auto sup = untyped_supervisor(*r.s.sys, r.sa);
    auto pipe = r.s.sys->spawn(fake_pipeline, sup, false);
    auto learner = scripted_learner(r.s, r.tmp, r.engine, 300);
    auto j = run(sup, pipe, [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      CHECK(r.engine->v == 0);  // nothing learned before it joined
      self->send(sup, register_atom::value, learner_atom::value, caf::actor_cast<caf::actor>(learner), caf::actor{},
                 std::string("trainer"));
    });
    INFO(j.dump());
    CHECK(j["ok"] == true);
    CHECK(r.engine->v == 3);
    for (auto& a : {caf::actor_cast<caf::actor>(learner), sup, pipe})
      self->send_exit(a, caf::exit_reason::user_shutdown);
  }
  SECTION("it never joins: the run ends after join_wait_s, saying how to start it") {
    r.sa.join_wait_s = 0.3;
    auto sup = untyped_supervisor(*r.s.sys, r.sa);
    auto pipe = r.s.sys->spawn(fake_pipeline, sup, false);
    auto j = run(sup, pipe, [] {});
    INFO(j.dump());
    CHECK(j["ok"] == false);
    CHECK(j["error"].get<std::string>().find(
              "the learner of node trainer did not join within 0.3 s ([cluster] join_wait_s): start it with "
              "`launch CONFIG --node trainer`") != std::string::npos);
    for (auto& a : {sup, pipe}) self->send_exit(a, caf::exit_reason::user_shutdown);
  }
  SECTION("it dies mid-run: the run ends naming its last checkpoint and --resume") {
    r.sa.experiment.steps = 100000;
    auto sup = untyped_supervisor(*r.s.sys, r.sa);
    auto pipe = r.s.sys->spawn(fake_pipeline, sup, false);
    auto learner = scripted_learner(r.s, r.tmp, r.engine, 300);
    auto j = run(sup, pipe, [&] {
      self->send(sup, register_atom::value, learner_atom::value, caf::actor_cast<caf::actor>(learner), caf::actor{},
                 std::string("trainer"));
      for (int i = 0; i < 5000 && !fs::exists(r.tmp.path / "checkpoints" / "step-2" / "learner.json"); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      self->send_exit(learner, caf::exit_reason::kill);
    });
    INFO(j.dump());
    CHECK(j["ok"] == false);
    const auto err = j["error"].get<std::string>();
    CHECK(err.find("the learner of node trainer is gone") != std::string::npos);
    CHECK(err.find("its last checkpoint is " + (r.tmp.path / "checkpoints" / "step-").string()) != std::string::npos);
    CHECK(err.find("(on node trainer); once the node runs again, `launch CONFIG --resume " + r.tmp.path.string() +
                   "` continues the run") != std::string::npos);
    for (auto& a : {sup, pipe}) self->send_exit(a, caf::exit_reason::user_shutdown);
  }
  SECTION("a second learner is ignored") {
    r.sa.learner_node.clear();
    auto learner = scripted_learner(r.s, r.tmp, r.engine, 300);
    r.sa.learner = learner;
    auto sup = untyped_supervisor(*r.s.sys, r.sa);
    auto pipe = r.s.sys->spawn(fake_pipeline, sup, false);
    auto other = r.s.sys->spawn(fake_pipeline, sup, false);  // would answer nothing a learner is asked
    self->send(sup, register_atom::value, learner_atom::value, other, caf::actor{}, std::string("trainer"));
    auto j = run(sup, pipe, [] {});
    INFO(j.dump());
    CHECK(j["ok"] == true);
    CHECK(r.engine->v == 3);
    for (auto& a : {caf::actor_cast<caf::actor>(learner), sup, pipe, other})
      self->send_exit(a, caf::exit_reason::user_shutdown);
  }
}

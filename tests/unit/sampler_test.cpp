// The sampler actor with a model backend: plans become Rollouts carrying the backend's tokens,
// logprobs and policy version; weight updates are applied and acknowledged with the version; a
// failing backend is retried, and nothing planned is lost.
#include "actors/sampler.hpp"
#include "policy/sampler_backend.hpp"
#include "messages/messages.hpp"
#include "actor_system.hpp"

#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include <atomic>
#include <mutex>

using namespace kernelrl;

namespace {

struct FakeBackend : SamplerBackend {
  std::atomic<int> fail_next{0};  // generations that throw before one succeeds
  std::atomic<int> calls{0};
  std::atomic<uint64_t> v{0};
  std::mutex mu;
  std::vector<size_t> batch_sizes;
  std::string name() const override { return "fake"; }
  std::vector<GenSample> generate(const std::vector<std::string>& prompts, const SamplingParams& p) override {
    ++calls;
    if (fail_next > 0) {
      --fail_next;
      throw BackendError("fake: server unavailable");
    }
    {
      std::lock_guard<std::mutex> g(mu);
      batch_sizes.push_back(prompts.size());
    }
    std::vector<GenSample> out;
    for (auto& pr : prompts)
      for (uint32_t j = 0; j < p.n; ++j)
        out.push_back({pr + "#" + std::to_string(j), {1, 2, 3}, {-0.1f, -0.2f, -0.3f}, "stop", v.load()});
    return out;
  }
  void apply_weights(const WeightsUpdate& u) override {
    if (u.tensors.size() == 1 && u.tensors[0].name == "bad") throw BackendError("fake: tensor bad is not mine");
    v = u.version;
  }
  uint64_t version() const override { return v; }
};

struct Collector {
  std::mutex mu;
  std::vector<Rollout> got;
};

rollout_sink::behavior_type collecting_dispatcher(std::shared_ptr<Collector> c) {
  return {[=](Rollout& r) {
            std::lock_guard<std::mutex> g(c->mu);
            c->got.push_back(std::move(r));
            return true;
          },
          [](skip_atom, Rollout&, std::string&) {}};
}

size_t collected(const std::shared_ptr<Collector>& c) {
  std::lock_guard<std::mutex> g(c->mu);
  return c->got.size();
}

bool wait_for(const std::function<bool()>& f, double seconds) {
  for (int i = 0; i < seconds * 100; ++i) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return f();
}

// The sampler's answer to a weights update: its error's text, or "" when it took the update.
std::string refusal(caf::scoped_actor& self, const sampler_actor& sampler, const WeightsUpdate& u) {
  std::string why;
  self->request(sampler, std::chrono::seconds(5), u)
      .receive([](uint64_t) {}, [&](caf::error& e) { why = self->system().render(e); });
  return why;
}

// A sampler with the fake backend, sending to a collecting dispatcher; `plan` asks for one step's
// samples and waits until `total` rollouts have arrived in all.
struct Rig {
  test::System s;
  caf::actor_system& sys = *s.sys;
  std::shared_ptr<FakeBackend> backend = std::make_shared<FakeBackend>();
  std::shared_ptr<Collector> col = std::make_shared<Collector>();
  rollout_sink dispatcher = sys.spawn(collecting_dispatcher, col);
  sampler_actor sampler;
  caf::scoped_actor self{sys};

  void start(SamplerArgs& a) {
    a.backend = backend;
    sampler = spawn_sampler(sys, a, dispatcher);
  }
  void plan(uint32_t step, uint64_t samples, size_t total, double seconds) {
    self->request(sampler, std::chrono::seconds(5), plan_atom::value, step)
        .receive([&](uint64_t n) { CHECK(n == samples); }, [&](caf::error& e) { FAIL(sys.render(e)); });
    REQUIRE(wait_for([&] { return collected(col) == total; }, seconds));
  }
  ~Rig() {
    self->send_exit(sampler, caf::exit_reason::user_shutdown);
    self->send_exit(dispatcher, caf::exit_reason::user_shutdown);
  }
};

}  // namespace

TEST_CASE("a model-backend sampler streams rollouts and acknowledges weight versions", "[actors][sampler]") {
  Rig rig;
  auto [backend, col, sampler, self] = std::tie(rig.backend, rig.col, rig.sampler, rig.self);
  SamplerArgs a;
  a.prompts = {{"t0", "P0"}, {"t1", "P1"}, {"t2", "P2"}};
  a.samples_per_task = 2;
  a.batch_prompts = 2;
  rig.start(a);

  rig.plan(0, 6, 6, 10);
  {
    std::lock_guard<std::mutex> g(col->mu);
    CHECK(backend->batch_sizes == std::vector<size_t>{2, 1});  // batch_prompts at a time
    for (auto& r : col->got) {
      CHECK(r.completion == a.prompts[r.group_id].prompt + "#" + std::to_string(r.sample_index));
      CHECK(r.task_id == a.prompts[r.group_id].task_id);
      CHECK(r.logprobs.size() == 3);
      CHECK(r.policy_version == 0);
    }
  }

  self->request(sampler, std::chrono::seconds(5), make_weights_update(5, {}))
      .receive([](uint64_t v) { CHECK(v == 5); }, [&](caf::error& e) { FAIL(rig.sys.render(e)); });
  // An update whose bytes changed after its checksum was taken is refused before the backend sees it.
  auto damaged = make_weights_update(7, {TensorBlob{"x", "f32", {1}, {0, 0, 128, 63}}});
  damaged.tensors[0].data[3] = 64;
  CHECK(refusal(self, sampler, damaged).find("weights update 7: the tensors' SHA-256 is") != std::string::npos);
  CHECK(backend->v == 5);  // it never reached the backend
  auto bad = make_weights_update(6, {TensorBlob{"bad", "f32", {1}, {0, 0, 0, 0}}});
  CHECK(refusal(self, sampler, bad).find("tensor bad is not mine") != std::string::npos);

  // Two failures, then success: the step's samples all arrive, with the new version.
  backend->fail_next = 2;
  rig.plan(1, 6, 12, 20);
  CHECK(backend->calls >= 6);
  std::lock_guard<std::mutex> g(col->mu);
  for (size_t i = 6; i < 12; ++i) {
    CHECK(col->got[i].policy_version == 5);
    CHECK(col->got[i].step == 1);
  }
}

TEST_CASE("bench_actions replace the completions of their tasks and keep the model's tokens", "[actors][sampler]") {
  Rig rig;
  SamplerArgs a;
  a.prompts = {{"t0", "P0"}, {"t1", "P1"}};
  a.samples_per_task = 3;
  a.bench_actions["t1"] = {"return x", "return y"};
  rig.start(a);
  rig.plan(0, 6, 6, 10);
  std::lock_guard<std::mutex> g(rig.col->mu);
  std::map<std::string, std::vector<std::string>> by_task;
  for (auto& r : rig.col->got) {
    by_task[r.task_id].push_back(r.completion);
    CHECK(r.token_ids == std::vector<int32_t>{1, 2, 3});  // the model's, for the learner
    CHECK(r.logprobs.size() == 3);
  }
  CHECK(by_task["t0"] == std::vector<std::string>{"P0#0", "P0#1", "P0#2"});  // no actions listed: the model's
  // group 1: (1 + sample index) mod 2
  CHECK(by_task["t1"] == std::vector<std::string>{"return y", "return x", "return y"});
}

TEST_CASE("the replay sampler refuses weight updates and plans of groups with an error", "[actors][sampler]") {
  test::System s;
  caf::actor_system& sys = *s.sys;
  auto col = std::make_shared<Collector>();
  auto dispatcher = sys.spawn(collecting_dispatcher, col);
  auto sampler = spawn_sampler(sys, SamplerArgs{}, dispatcher);
  caf::scoped_actor self{sys};
  CHECK(refusal(self, sampler, make_weights_update(3, {})).find("replay backend") != std::string::npos);
  // Nor a plan of some groups (a supervisor's share): it replays every recorded action at once.
  SamplePlan part;
  part.step = 2;
  part.task_ids = {"t0"};
  part.group_ids = {0};
  std::string why;
  self->request(sampler, std::chrono::seconds(5), part)
      .receive([](uint64_t) { FAIL("a replay sampler took a plan of groups"); },
               [&](caf::error& e) { why = sys.render(e); });
  CHECK(why.find("cannot take a plan of 1 group for step 2") != std::string::npos);
  self->send_exit(sampler, caf::exit_reason::user_shutdown);
  self->send_exit(dispatcher, caf::exit_reason::user_shutdown);
}

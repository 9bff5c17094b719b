// Multi-turn episodes ([experiment] turns): the later turns' prompts and their cutting rule, the
// feedback the policy reads, the experiments that drive the turns (train, eval), the sampler pool
// re-planning a later turn, and TRLOO's advantages against an independent formulation.
#include "experiment/sampler_pool.hpp"
#include "experiment/experiment.hpp"
#include "learner/advantages.hpp"
#include "tasks/prompt.hpp"

#include "tests/unit/actions.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace kernelrl;

namespace {

using test::of;

// The samples of a plan: sample j's status and reward from `verdict(task, turn, j)`.
struct Verdict {
  EvalStatus status;
  double reward;
};
template <class F>
std::vector<ScoredRollout> draw(const SamplePlan& p, F verdict) {
  std::vector<ScoredRollout> out;
  for (size_t k = 0; k < p.task_ids.size(); ++k)
    for (uint32_t i = 0; i < p.n; ++i) {
      const uint32_t j = p.first_index + i;
      const Verdict v = verdict(p.task_ids[k], p.turn, j);
      ScoredRollout s;
      s.rollout.task_id = p.task_ids[k];
      s.rollout.group_id = p.group_ids[k];
      s.rollout.sample_index = j;
      s.rollout.sample_id = make_sample_id(p.task_ids[k], p.group_ids[k], j);
      s.rollout.step = p.step;
      s.rollout.turn = p.turn;
      s.rollout.completion =
          "code " + p.task_ids[k] + " turn " + std::to_string(p.turn) + " episode " + std::to_string(j);
      if (p.turn > 1) s.rollout.parent_id = p.history.at(i).back().sample_id;
      s.result.status = v.status;
      s.result.error = v.status == EvalStatus::format_error ? "no ```python block in the answer" : "";
      s.result.speedup = v.status == EvalStatus::ok ? 1.5 : 0;
      s.reward = v.reward;
      out.push_back(s);
    }
  return out;
}

size_t chars_over_4(const std::string& s) { return (s.size() + 3) / 4; }

PolicyConfig chatml() {
  PolicyConfig p;
  p.template_ = "chatml";
  p.system = "SYS";
  return p;
}

}  // namespace

TEST_CASE("the feedback names what went wrong, with its numbers, and keeps a long log's head and tail", "[turns]") {
  EvalResult ok;
  ok.status = EvalStatus::ok;
  ok.correctness.trials = 5;
  ok.correctness.passed = 5;
  ok.runtime.median_ms = 0.5;
  ok.ref_runtime.median_ms = 1.0;
  ok.speedup = 2.0;
  ok.kernel_coverage = 0.25;
  auto f = feedback_text(ok, 2000);
  CHECK(f.find("correct on 5 of 5 trials") != std::string::npos);
  CHECK(f.find("a speedup of 2x") != std::string::npos);
  CHECK(f.find("25% of the GPU time") != std::string::npos);
  EvalResult bad;
  bad.status = EvalStatus::incorrect;
  bad.correctness = {5, 2, 0.75, 0.1, 1e-2, 1e-2, "trial 3: values differ at [0, 4]"};
  f = feedback_text(bad, 2000);
  CHECK(f.find("disagree with the reference: trial 3: values differ at [0, 4]") != std::string::npos);
  CHECK(f.find("correct on 2 of 5 trials") != std::string::npos);
  EvalResult ce;
  ce.status = EvalStatus::compile_error;
  ce.error = "nvcc failed";
  for (int i = 0; i < 400; ++i) ce.compile_log += "line " + std::to_string(i) + ": error: something\n";
  f = feedback_text(ce, 600);
  CHECK(f.size() <= 600);
  CHECK(f.find("failed to build or import: nvcc failed") != std::string::npos);
  CHECK(f.find("line 0: error") != std::string::npos);    // the head
  CHECK(f.find("line 399: error") != std::string::npos);  // and the tail
  CHECK(f.find("characters cut") != std::string::npos);
}

TEST_CASE("a later turn's prompt is the conversation so far in the template's own turns", "[turns]") {
  std::vector<Attempt> h = {{"t#0.0", "ATTEMPT-1", "FEEDBACK-1"}, {"t#1.0", "ATTEMPT-2", "FEEDBACK-2"}};
  auto p = render_turn_prompt(chatml(), "TASK", h, 1 << 20, chars_over_4);
  const std::string want =
      "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\nTASK<|im_end|>\n"
      "<|im_start|>assistant\nATTEMPT-1<|im_end|>\n<|im_start|>user\nFEEDBACK-1\n\n" +
      std::string(refine_instruction) +
      "<|im_end|>\n<|im_start|>assistant\nATTEMPT-2<|im_end|>\n<|im_start|>user\nFEEDBACK-2\n\n" + refine_instruction +
      "<|im_end|>\n<|im_start|>assistant\n";
  CHECK(p.text == want);
  CHECK(p.omitted == 0);
  CHECK(p.tokens == chars_over_4(want));
  // The first turn's prompt is where every later one starts.
  CHECK(p.text.rfind(render_prompt(chatml(), "TASK").substr(0, 60), 0) == 0);
  PolicyConfig custom;
  custom.template_ = "[S]{system}[U]{user}[A]";
  custom.system = "SYS";
  auto c = render_turn_prompt(custom, "TASK", h, 1 << 20, chars_over_4);
  CHECK(c.text.rfind("[S]SYS[U]TASK\n\nYour attempt 1:\nATTEMPT-1\n\nFEEDBACK-1", 0) == 0);
  CHECK(c.text.substr(c.text.size() - 3) == "[A]");
}

TEST_CASE("a long history is cut by the stated rule: oldest code first, then the middle of the latest", "[turns]") {
  const std::string big(4000, 'x'), last = std::string(2000, 'a') + std::string(2000, 'b');
  std::vector<Attempt> h = {{"t#0.0", big, "F1"}, {"t#1.0", big, "F2"}, {"t#2.0", last, "F3"}};
  const size_t whole = chars_over_4(render_turn_prompt(chatml(), "TASK", h, 1 << 20, chars_over_4).text);
  // Room for the latest attempt whole but not the others: both older codes go, feedback stays.
  auto p = render_turn_prompt(chatml(), "TASK", h, 1300, chars_over_4);
  CHECK(p.tokens <= 1300);
  CHECK(p.omitted == 2);
  CHECK(p.cut_chars == 0);
  CHECK(p.text.find(last) != std::string::npos);
  CHECK(p.text.find("the code of attempt 1 is left out") != std::string::npos);
  CHECK(p.text.find("the code of attempt 2 is left out") != std::string::npos);
  CHECK(p.text.find("F1") != std::string::npos);
  // Less room: the latest attempt loses its middle, its head and tail kept.
  p = render_turn_prompt(chatml(), "TASK", h, 700, chars_over_4);
  CHECK(p.tokens <= 700);
  CHECK(p.cut_chars > 0);
  CHECK(p.text.find("characters cut to fit the context") != std::string::npos);
  CHECK(p.text.find(std::string(500, 'a')) != std::string::npos);
  CHECK(p.text.find(std::string(500, 'b')) != std::string::npos);
  CHECK(whole > 3000);
  // A task message longer than the budget is never cut.
  auto q = render_turn_prompt(chatml(), std::string(8000, 't'), h, 700, chars_over_4);
  CHECK(q.text.find(std::string(8000, 't')) != std::string::npos);
}

TEST_CASE("TRLOO: each turn's advantage is its return less the mean return of the other episodes at that turn",
          "[turns]") {
  // An independent formulation: returns by explicit sums of the discounted future rewards, and
  // the leave-one-out baseline as (N G_i - sum G) / (N - 1), the form Dr. Kernel's code uses.
  const std::vector<std::vector<double>> r = {{0, 1, 1}, {1, 0, 0.5}, {0, 0, 0}, {0.25, 1, 2}};
  for (double gamma : {1.0, 0.9, 0.0}) {
    AdvantageOptions o;
    o.estimator = "trloo";
    auto got = episode_advantages(r, gamma, o);
    const size_t N = r.size(), T = r[0].size();
    for (size_t t = 0; t < T; ++t) {
      std::vector<double> G(N, 0.0);
      for (size_t i = 0; i < N; ++i)
        for (size_t u = t; u < T; ++u) G[i] += std::pow(gamma, double(u - t)) * r[i][u];
      double sum = 0;
      for (double g : G) sum += g;
      for (size_t i = 0; i < N; ++i)
        CHECK(got.advantages[i][t] == Approx((double(N) * G[i] - sum) / double(N - 1)).margin(1e-12));
    }
  }
  // One turn: rloo on the rewards.
  AdvantageOptions rloo;
  rloo.estimator = "rloo";
  auto one = episode_advantages({{1.0}, {0.0}, {0.5}}, 1.0, rloo);
  auto plain = group_advantages({1.0, 0.0, 0.5}, rloo);
  for (size_t i = 0; i < 3; ++i) CHECK(one.advantages[i][0] == plain.advantages[i]);
  // A turn whose returns are all equal carries no signal.
  AdvantageOptions t;
  t.estimator = "trloo";
  auto flat = episode_advantages({{0, 1}, {1, 1}}, 1.0, t);
  CHECK_FALSE(flat.skipped[0]);
  CHECK(flat.skipped[1]);
}

TEST_CASE("the progress bonus: a later turn earns alpha times its gain over the turn before, on its own return",
          "[turns]") {
  // By hand: rewards (0, 3, 3), gamma 0.5: returns (0 + 0.5 * (3 + 0.5 * 3), 3 + 0.5 * 3, 3) =
  // (2.25, 4.5, 3); alpha 0.5 adds 0.5 * (3 - 0) to turn 2 and 0.5 * (3 - 3) to turn 3: (2.25, 6, 3).
  auto g = turn_returns({0, 3, 3}, 0.5, 0.5);
  REQUIRE(g.size() == 3);
  CHECK(g[0] == Approx(2.25));
  CHECK(g[1] == Approx(6.0));
  CHECK(g[2] == Approx(3.0));
  // The first turn is not paid for a worse answer: with gamma 1 and a large alpha, a first turn
  // of 0 followed by 2 learns less than a first turn of 2 followed by 2.
  CHECK(turn_returns({0, 2}, 1.0, 5.0)[0] < turn_returns({2, 2}, 1.0, 5.0)[0]);
  // A later turn that undoes a good one loses by its fall; with alpha 0 the rewards are as given.
  auto worse = turn_returns({2, 0}, 0.0, 1.0);
  CHECK(worse[1] == Approx(-2.0));
  CHECK(worse[0] == Approx(2.0));
  CHECK(turn_returns({2, 0, 1}, 1.0, 0.0) == turn_returns({2, 0, 1}, 1.0));
  // Repair beats repetition at turn 2: a format error (0) fixed to 2 against a 2 repeated.
  CHECK(turn_returns({0, 2}, 0.0, 1.0)[1] > turn_returns({2, 2}, 0.0, 1.0)[1]);
}

namespace {
// One train step of two tasks, groups of two, episodes of three turns, returns discounted by 0.5.
ExperimentArgs three_turn_training() {
  ExperimentArgs a;
  a.run_id = "r";
  a.run_dir = "/runs/r";
  a.mode = Mode::train;
  a.task_ids = {"t1", "t2"};
  a.steps = 1;
  a.batch_size = 2;
  a.group_size = 2;
  a.turns = 3;
  a.turn_gamma = 0.5;
  return a;
}
}  // namespace

TEST_CASE("train with turns: later turns follow each group's feedback; the learner gets every turn with returns",
          "[turns][experiment]") {
  ExperimentArgs a = three_turn_training();
  auto e = make_experiment(a);
  auto first = e->start(0, {}, {});
  auto steps = of<act::LearnStep>(first);
  REQUIRE(steps.size() == 1);
  CHECK(steps[0].groups == 6);  // two tasks, three turns each
  auto plans = of<act::Sample>(first);
  REQUIRE(plans.size() == 1);
  CHECK(plans[0].plan.turn == 1);
  // Episode 0 writes prose at turn 1 and fixes it; episode 1 is correct from the start.
  auto verdict = [](const std::string&, uint32_t turn, uint32_t j) {
    if (j == 0 && turn == 1) return Verdict{EvalStatus::format_error, 0.0};
    return Verdict{EvalStatus::ok, double(turn)};
  };
  std::vector<SamplePlan> queue = {plans[0].plan};
  std::vector<act::Learn> learned;
  std::vector<act::StepDone> done;
  std::map<uint32_t, int> plans_of_turn;
  std::set<uint64_t> gids;
  while (!queue.empty()) {
    SamplePlan p = queue.front();
    queue.erase(queue.begin());
    ++plans_of_turn[p.turn];
    for (auto g : p.group_ids) CHECK(gids.insert(g).second);  // every turn a group id of its own
    e->planned(uint64_t(p.task_ids.size()) * p.n);
    for (auto& s : draw(p, verdict)) {
      auto out = e->sampled(s);
      for (auto& x : of<act::Sample>(out)) {
        const auto& q = x.plan;
        REQUIRE(q.task_ids.size() == 1);
        REQUIRE(q.history.size() == 2);
        CHECK(q.turn >= 2);
        for (uint32_t j = 0; j < 2; ++j) {
          REQUIRE(q.history[j].size() == q.turn - 1);
          // The episode's own attempts, oldest first, each with the evaluator's feedback.
          CHECK(q.history[j].back().completion ==
                "code " + q.task_ids[0] + " turn " + std::to_string(q.turn - 1) + " episode " + std::to_string(j));
        }
        if (q.turn == 2) CHECK(q.history[0][0].feedback.find("could not use your answer") != std::string::npos);
        queue.push_back(q);
      }
      for (auto& x : of<act::Learn>(out)) learned.push_back(x);
      for (auto& x : of<act::StepDone>(out)) done.push_back(x);
    }
  }
  CHECK(plans_of_turn == std::map<uint32_t, int>{{1, 1}, {2, 2}, {3, 2}});
  REQUIRE(learned.size() == 12);
  REQUIRE(done.size() == 1);
  CHECK(done[0].stats.samples == 12);
  CHECK(done[0].stats.status_counts.at("format_error") == 2);
  CHECK(done[0].stats.mean_reward == Approx((0 + 2 + 3 + 1 + 2 + 3) * 2 / 12.0));  // the rewards, not the returns
  for (auto& l : learned) {
    const auto& r = l.sample.rollout;
    // G_t = r_t + 0.5 G_{t+1}: the rewards are (0 | 1, 2, 3) by turn, episode 0 earning 0 at turn 1.
    const double r3 = 3, r2 = 2 + 0.5 * r3, r1 = (r.sample_index == 0 ? 0.0 : 1.0) + 0.5 * r2;
    CHECK(l.sample.reward == Approx(r.turn == 3 ? r3 : r.turn == 2 ? r2 : r1));
  }
}

TEST_CASE("learn_turns = last: every turn is sampled and counted, only the last turn's groups are learned from",
          "[turns][experiment]") {
  ExperimentArgs a = three_turn_training();
  a.turn_progress = 1.0;
  a.learn_last_turn = true;
  auto e = make_experiment(a);
  auto first = e->start(0, {}, {});
  auto steps = of<act::LearnStep>(first);
  REQUIRE(steps.size() == 1);
  CHECK(steps[0].groups == 2);  // the learner waits for the two tasks' last turns only
  auto verdict = [](const std::string&, uint32_t turn, uint32_t j) {
    if (j == 0 && turn == 1) return Verdict{EvalStatus::format_error, 0.0};
    return Verdict{EvalStatus::ok, double(turn)};
  };
  std::vector<SamplePlan> queue = {of<act::Sample>(first).at(0).plan};
  std::vector<act::Learn> learned;
  std::vector<act::StepDone> done;
  uint64_t sampled = 0;
  while (!queue.empty()) {
    SamplePlan p = queue.front();
    queue.erase(queue.begin());
    e->planned(uint64_t(p.task_ids.size()) * p.n);
    for (auto& s : draw(p, verdict)) {
      ++sampled;
      auto out = e->sampled(s);
      for (auto& x : of<act::Sample>(out)) queue.push_back(x.plan);
      for (auto& x : of<act::Learn>(out)) learned.push_back(x);
      for (auto& x : of<act::StepDone>(out)) done.push_back(x);
    }
  }
  CHECK(sampled == 12);
  REQUIRE(learned.size() == 4);
  int ends = 0;
  for (auto& l : learned) {
    CHECK(l.sample.rollout.turn == 3);
    // The last turn's return: its reward 3 and its progress over turn 2's 2.
    CHECK(l.sample.reward == Approx(3 + 1.0 * (3 - 2)));
    ends += l.last;
  }
  CHECK(ends == 2);           // each learned group ends once
  REQUIRE(done.size() == 1);  // the step's row counts every turn
  CHECK(done[0].stats.samples == 12);
  CHECK(done[0].stats.status_counts.at("format_error") == 2);
}

TEST_CASE("eval with turns: K episodes a task, each later turn planned once the turn before is in", "[turns]") {
  ExperimentArgs a;
  a.mode = Mode::eval;
  a.task_ids = {"t1", "t2"};
  a.group_size = 3;
  a.turns = 2;
  auto e = make_experiment(a);
  auto first = e->start(0, {}, {});
  auto plans = of<act::Sample>(first);
  REQUIRE(plans.size() == 1);
  CHECK(plans[0].plan.n == 3);
  e->planned(6);
  std::vector<SamplePlan> later;
  bool finished = false;
  for (auto& s : draw(plans[0].plan, [](auto&, uint32_t, uint32_t) { return Verdict{EvalStatus::incorrect, 0}; }))
    for (auto& x : of<act::Sample>(e->sampled(s))) later.push_back(x.plan);
  REQUIRE(later.size() == 2);
  for (auto& p : later) {
    e->planned(3);
    for (auto& s : draw(p, [](auto&, uint32_t, uint32_t) { return Verdict{EvalStatus::ok, 1}; }))
      for (auto& f : of<act::Finish>(e->sampled(s))) finished = f.error.empty();
  }
  CHECK(finished);
  CHECK(e->final_row()->samples == 12);
  CHECK(e->summary("", {})["turns"] == 2);
}

TEST_CASE("a later turn's group on a lost sampler is planned again with its samples' histories", "[turns]") {
  SamplerPool pool(2);
  SamplePlan p;
  p.step = 0;
  p.n = 3;
  p.turn = 2;
  p.task_ids = {"t"};
  p.group_ids = {7};
  p.history = {{{"t#1.0", "a0", "f0"}}, {{"t#1.1", "a1", "f1"}}, {{"t#1.2", "a2", "f2"}}};
  auto parts = pool.assign(p);
  REQUIRE(parts.size() == 1);
  CHECK(parts[0].second.turn == 2);
  CHECK(parts[0].second.history == p.history);
  pool.arrived("t", 7, 0);
  auto again = pool.lost(parts[0].first);
  REQUIRE(again.size() == 1);
  const auto& q = again[0].second;
  CHECK(q.first_index == 1);
  CHECK(q.n == 2);
  CHECK(q.turn == 2);
  REQUIRE(q.history.size() == 2);
  CHECK(q.history[0][0].sample_id == "t#1.1");
  CHECK(q.history[1][0].sample_id == "t#1.2");
}

// The learner's objectives (learner/objective.hpp): what each makes of a group's samples, without a
// model (the policy's scores for self-distillation given here).
#include "learner/objective.hpp"

#include <catch2/catch.hpp>

#include <cmath>

using namespace kernelrl;

namespace {
LearnSample sample(double reward, size_t tokens, std::string teacher = "") {
  LearnSample s;
  s.prompt = "p";
  s.reward = reward;
  for (size_t i = 0; i < tokens; ++i) {
    s.token_ids.push_back(int32_t(10 + i));
    s.logprobs.push_back(-0.5f * float(i + 1));
  }
  s.teacher_prompt = std::move(teacher);
  return s;
}

LearnerOptions options(const std::string& objective, const std::string& estimator = "grpo") {
  LearnerOptions o;
  o.objective = objective;
  o.learner.algorithm = estimator;
  o.sdpo_beta = 2.0;
  return o;
}

// A policy whose every token has logprob -1 after any prompt; prompts encode to one id a character.
PolicyScores constant_policy(int* calls) {
  PolicyScores p;
  p.encode = [](const std::string& text) { return std::vector<int32_t>(text.size(), 7); };
  p.score = [calls](const std::vector<std::vector<int32_t>>& prompts, const std::vector<std::vector<int32_t>>& comps) {
    ++*calls;
    std::vector<std::vector<float>> out;
    for (size_t i = 0; i < prompts.size(); ++i) out.emplace_back(comps[i].size(), -1.0f);
    return out;
  };
  p.minibatch = 2;
  return p;
}
}  // namespace

TEST_CASE("group-relative: per-sequence advantages from the rewards, a tie teaches nothing", "[objective]") {
  auto grpo = make_objective(options("grpo"));
  CHECK_FALSE(grpo->needs_policy());
  std::vector<LearnSample> group{sample(1, 3), sample(0, 2), sample(0, 4), sample(1, 1)};
  auto out = grpo->plan(group);
  REQUIRE(out.advantages.size() == 4);
  CHECK_FALSE(out.skipped);
  // grpo: (r - 0.5) / (std + 1e-4), std the unbiased one: sqrt(1/3)
  const double a = 0.5 / (std::sqrt(1.0 / 3.0) + 1e-4);
  CHECK(out.advantages[0] == Approx(a));
  CHECK(out.advantages[1] == Approx(-a));
  int calls = 0;
  CHECK(grpo->token_advantages(group, constant_policy(&calls), out).empty());  // per sequence
  CHECK(calls == 0);
  std::vector<LearnSample> tie{sample(1, 3), sample(1, 2)};
  CHECK(grpo->plan(tie).skipped);
  auto rloo = make_objective(options("grpo", "rloo"))->plan(group);
  CHECK(rloo.advantages[0] == Approx(1.0 - 1.0 / 3.0));  // 1 - mean of the other three
}

TEST_CASE("group-relative: the samples' own per-token advantages, never mixed with per-sequence ones", "[objective]") {
  auto grpo = make_objective(options("grpo"));
  std::vector<LearnSample> group{sample(0, 2), sample(0, 3)};
  group[0].token_advantages = {0.5f, 0.25f};
  group[1].token_advantages = {-1.0f, 0.0f, 1.0f};
  auto out = grpo->plan(group);
  CHECK(out.advantages.empty());
  int calls = 0;
  auto adv = grpo->token_advantages(group, constant_policy(&calls), out);
  REQUIRE(adv.size() == 2);
  CHECK(adv[1] == std::vector<float>{-1.0f, 0.0f, 1.0f});
  group[1].token_advantages.clear();
  CHECK_THROWS_WITH(grpo->plan(group), "learner: a group mixes per-token and per-sequence advantages");
}

TEST_CASE("every objective refuses a sample whose logprobs or token advantages do not match its tokens",
          "[objective]") {
  for (auto name : {"grpo", "sdpo"}) {
    auto obj = make_objective(options(name));
    std::vector<LearnSample> group{sample(1, 3), sample(0, 2)};
    group[1].logprobs.pop_back();
    CHECK_THROWS_WITH(obj->plan(group), "learner: sample 1 of the group has 2 tokens but 1 logprobs");
    group[1] = sample(0, 2);
    group[0].token_advantages = {1.0f};
    CHECK_THROWS_WITH(obj->plan(group), "learner: sample 0: token_advantages has 1 entries for 3 tokens");
  }
  CHECK_THROWS_WITH(make_objective(options("ppo")), "learner: objective \"ppo\": expected grpo or sdpo");
}

TEST_CASE("self-distillation: beta x (teacher - student logprob) a token, only where a teacher prompt is",
          "[objective]") {
  auto sdpo = make_objective(options("sdpo"));
  CHECK(sdpo->needs_policy());
  std::vector<LearnSample> group{sample(1, 3, "teach"), sample(0, 2), sample(0, 2, "ab"), sample(1, 0, "x")};
  auto out = sdpo->plan(group);
  CHECK_FALSE(out.skipped);
  CHECK(out.advantages.empty());  // rewards play no part
  int calls = 0;
  auto adv = sdpo->token_advantages(group, constant_policy(&calls), out);
  CHECK(calls == 1);  // the two samples with a teacher and tokens, in one minibatch of 2
  REQUIRE(adv.size() == 4);
  // student logprobs -0.5, -1, -1.5; the teacher's -1 each; beta 2
  CHECK(adv[0] == std::vector<float>{-1.0f, 0.0f, 1.0f});
  CHECK(adv[1].empty());  // no teacher prompt: left out
  CHECK(adv[2] == std::vector<float>{-1.0f, 0.0f});
  CHECK(adv[3].empty());  // nothing generated
  CHECK(out.teacher_logprob_sum[0] == Approx(-3.0));
  CHECK(out.student_logprob_sum[0] == Approx(-3.0));
  CHECK(out.teacher_tokens[0] == 5 + 3);  // the teacher's prompt and the sample's tokens
  CHECK(out.teacher_tokens[1] == 0);
  std::vector<LearnSample> none{sample(1, 3), sample(0, 2)};
  auto nothing = sdpo->plan(none);
  CHECK(sdpo->token_advantages(none, constant_policy(&calls), nothing).size() == 2);
  CHECK(nothing.skipped);
}

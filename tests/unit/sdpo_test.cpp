// SDPO's teacher context (learner/sdpo.hpp): what the teacher is shown about a group's samples.
#include "learner/sdpo.hpp"

#include <catch2/catch.hpp>

using namespace kernelrl;

namespace {
ScoredRollout sample(const std::string& code, EvalStatus status, double speedup = 0) {
  ScoredRollout s;
  s.rollout.task_id = "t";
  s.rollout.completion = code;
  s.result.status = status;
  s.result.speedup = speedup;
  if (status == EvalStatus::ok) {
    s.result.runtime.median_ms = 2.0 / speedup;
    s.result.runtime.trials = 5;
    s.result.ref_runtime.median_ms = 2.0;
    s.result.correctness = {6, 6, 1e-6, 1e-5, 1e-2, 1e-2, ""};
  }
  return s;
}
}  // namespace

TEST_CASE("execution feedback states status, correctness, timing and errors but no code", "[sdpo]") {
  auto ok = sample("return x * 2  # CODE-A", EvalStatus::ok, 1.25);
  auto f = execution_feedback(ok.result, SdpoConfig{}.max_error_chars);
  CHECK(f.find("- status: ok") != std::string::npos);
  CHECK(f.find("- compiled: yes") != std::string::npos);
  CHECK(f.find("- correct: yes (6 of 6 trials") != std::string::npos);
  CHECK(f.find("- runtime: 1.6 ms median over 5 runs (reference 2 ms)") != std::string::npos);
  CHECK(f.find("- speedup: 1.250x (faster than the reference)") != std::string::npos);
  CHECK(f.find("CODE-A") == std::string::npos);

  auto bad = sample("CODE-B", EvalStatus::compile_error);
  bad.result.error = "build failed";
  bad.result.compile_log = std::string(5000, 'x') + "\nerror: 'foo' was not declared";
  f = execution_feedback(bad.result, 100);
  CHECK(f.find("- compiled: no") != std::string::npos);
  CHECK(f.find("- error: build failed") != std::string::npos);
  CHECK(f.find("'foo' was not declared") != std::string::npos);  // the end of the log is kept
  CHECK(f.find("characters cut") != std::string::npos);
  CHECK(f.size() < 400);

  auto wrong = sample("CODE-C", EvalStatus::incorrect);
  wrong.result.correctness = {6, 2, 0.5, 3.0, 1e-2, 1e-2, "trial 2: shape [4, 8] != [8, 4]"};
  f = execution_feedback(wrong.result, SdpoConfig{}.max_error_chars);
  CHECK(f.find("- correct: no (2 of 6 trials") != std::string::npos);
  CHECK(f.find("- first mismatch: trial 2: shape [4, 8] != [8, 4]") != std::string::npos);
  CHECK(f.find("speedup") == std::string::npos);
}

TEST_CASE("the teacher sees the fastest correct sample of the group, never the sample's own code", "[sdpo]") {
  std::vector<ScoredRollout> g = {sample("SLOW-OK", EvalStatus::ok, 0.8), sample("FAST-OK", EvalStatus::ok, 1.9),
                                  sample("BROKEN", EvalStatus::runtime_error), sample("MID-OK", EvalStatus::ok, 1.2)};
  SdpoConfig o;
  auto t = teacher_sections(g, o);
  REQUIRE(t.size() == 4);
  for (size_t i = 0; i < g.size(); ++i) CHECK(t[i].find(g[i].rollout.completion) == std::string::npos);
  CHECK(t[0].find("FAST-OK") != std::string::npos);
  CHECK(t[2].find("FAST-OK") != std::string::npos);
  CHECK(t[1].find("MID-OK") != std::string::npos);  // the fastest other than itself
  CHECK(t[2].find("- status: runtime_error") != std::string::npos);
  CHECK(t[1].find("- speedup: 1.900x") != std::string::npos);

  o.demonstration = false;  // feedback alone
  t = teacher_sections(g, o);
  CHECK(t[0].find("FAST-OK") == std::string::npos);
  CHECK(t[0].find("- status: ok") != std::string::npos);

  o = SdpoConfig{};
  o.context = "prompt";  // demonstration alone: a group with one correct sample gives it nothing
  std::vector<ScoredRollout> one = {sample("ONLY-OK", EvalStatus::ok, 1.1), sample("BAD", EvalStatus::incorrect),
                                    sample("BAD2", EvalStatus::timeout)};
  t = teacher_sections(one, o);
  CHECK(t[0].empty());
  CHECK(t[1].find("ONLY-OK") != std::string::npos);
  CHECK(t[1].find("status") == std::string::npos);
  CHECK(t[2].find("ONLY-OK") != std::string::npos);
  // No correct sample at all: the prompt variant has nothing to teach.
  std::vector<ScoredRollout> none = {sample("A", EvalStatus::incorrect), sample("B", EvalStatus::timeout)};
  for (auto& x : teacher_sections(none, o)) CHECK(x.empty());
}

TEST_CASE("the teacher's user message is the student's followed by the section", "[sdpo]") {
  CHECK(teacher_user_message("Write it.", "Feedback.") == "Write it.\n\nFeedback.");
}

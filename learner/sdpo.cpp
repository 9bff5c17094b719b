#include "learner/sdpo.hpp"

#include <fmt/format.h>

namespace kernelrl {

namespace {

// The last `n` characters of `s` (errors end with what matters), marked when cut.
std::string tail(const std::string& s, size_t n) {
  if (s.size() <= n) return s;
  return "[... " + std::to_string(s.size() - n) + " characters cut ...]\n" + s.substr(s.size() - n);
}

std::string trimmed(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

}  // namespace

std::string execution_feedback(const EvalResult& r, size_t max_error_chars) {
  std::string f;
  const bool built = r.status != EvalStatus::format_error && r.status != EvalStatus::compile_error;
  f += "- status: " + to_string(r.status) + "\n";
  f += std::string("- compiled: ") +
       (r.status == EvalStatus::format_error ? "not reached (the answer could not be parsed)"
        : built                              ? "yes"
                                             : "no") +
       "\n";
  const bool correct = r.status == EvalStatus::ok || r.status == EvalStatus::unconfirmed;
  if (correct || r.status == EvalStatus::incorrect) {
    const auto& c = r.correctness;
    f += fmt::format(
        "- correct: {} ({} of {} trials within atol {:g}, rtol {:g}; max abs diff {:.4g}, max rel diff {:.4g})\n",
        correct ? "yes" : "no", c.passed, c.trials, c.atol, c.rtol, c.max_abs_diff, c.max_rel_diff);
    if (!c.detail.empty()) f += "- first mismatch: " + tail(c.detail, max_error_chars) + "\n";
  }
  if (correct) {
    f += fmt::format("- runtime: {:.4g} ms median over {} runs (reference {:.4g} ms)\n", r.runtime.median_ms,
                     r.runtime.trials, r.ref_runtime.median_ms);
    f += fmt::format("- speedup: {:.3f}x ({} than the reference)\n", r.speedup,
                     r.speedup > 1.0 ? "faster" : "not faster");
  }
  if (r.status == EvalStatus::unconfirmed) f += "- unconfirmed: " + tail(trimmed(r.review), max_error_chars) + "\n";
  std::string err = trimmed(r.error);
  if (!err.empty() && r.status != EvalStatus::ok) f += "- error: " + tail(err, max_error_chars) + "\n";
  std::string log = trimmed(r.compile_log);
  if (!log.empty() && r.status == EvalStatus::compile_error)
    f += "- build output:\n```\n" + tail(log, max_error_chars) + "\n```\n";
  return f;
}

std::vector<std::string> teacher_sections(const std::vector<ScoredRollout>& group, const SdpoConfig& o) {
  std::vector<std::string> out(group.size());
  for (size_t i = 0; i < group.size(); ++i) {
    // The fastest correct sample other than this one (the earliest on a tie).
    long demo = -1;
    if (o.demonstration)
      for (size_t j = 0; j < group.size(); ++j)
        if (j != i && group[j].result.status == EvalStatus::ok &&
            (demo < 0 || group[j].result.speedup > group[size_t(demo)].result.speedup))
          demo = long(j);
    std::string s;
    if (demo >= 0)
      s += fmt::format(
          "A correct answer to this task from another attempt ({:.3f}x the reference's speed):\n"
          "<answer>\n{}\n</answer>\n\n",
          group[size_t(demo)].result.speedup, trimmed(group[size_t(demo)].rollout.completion));
    if (o.context == "feedback")
      s += "Execution feedback on your previous attempt at this task (its code is not shown):\n" +
           execution_feedback(group[i].result, o.max_error_chars) + "\n";
    if (s.empty()) continue;
    out[i] = s + "Taking this into account, answer the task.";
  }
  return out;
}

std::string teacher_user_message(const std::string& user, const std::string& section) {
  return user + "\n\n" + section;
}

}  // namespace kernelrl

#include "tasks/prompt.hpp"

#include "core/task_set.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

namespace kernelrl {

bool task_user_message(const Task& task, const std::string& action_space, const std::vector<std::string>& languages,
                       std::string& out, std::string& err) {
  std::ifstream in(task.path);
  if (!in) {
    err = task.path + ": cannot read the task";
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const bool cuda = std::find(languages.begin(), languages.end(), "cuda") != languages.end();
  const bool triton = std::find(languages.begin(), languages.end(), "triton") != languages.end();
  // What kernels the policy may write: CUDA through load_inline (the default wording), Triton's
  // @triton.jit kernels, or either.
  const std::string triton_how = "Triton kernels (import triton and triton.language as tl; @triton.jit functions)";
  const std::string may = cuda && triton ? "You may write custom CUDA kernels, built with "
                                           "torch.utils.cpp_extension.load_inline, or " +
                                               triton_how + "."
                                         : "You may write custom " + triton_how + ".";
  std::string what;
  if (triton) {
    what = action_space == "full_program"
               ? "Write a complete Python program that defines `class ModelNew(nn.Module)` with the same constructor "
                 "arguments and outputs as `Model`, but faster on the GPU. " +
                     may + " Keep get_inputs and get_init_inputs unchanged."
               : "Write the body of `ModelNew.forward`: the statements that replace `Model.forward`'s body, with the "
                 "same arguments (and `self`, which holds everything `Model.__init__` created) and the same outputs, "
                 "but faster on the GPU. " +
                     may +
                     " Definitions the body needs (imports, kernels) may come first, followed by a line "
                     "`# --- forward ---` and then the body. The body must end with a return statement.";
  } else if (action_space == "full_program") {
    what =
        "Write a complete Python program that defines `class ModelNew(nn.Module)` with the same constructor "
        "arguments and outputs as `Model`, but faster on the GPU. You may write custom CUDA kernels and build them "
        "with torch.utils.cpp_extension.load_inline. Keep get_inputs and get_init_inputs unchanged.";
  } else {
    what =
        "Write the body of `ModelNew.forward`: the statements that replace `Model.forward`'s body, with the same "
        "arguments (and `self`, which holds everything `Model.__init__` created) and the same outputs, but faster "
        "on the GPU. You may define and build custom CUDA kernels inside the body with "
        "torch.utils.cpp_extension.load_inline. The body must end with a return statement.";
  }
  out = "Here is a PyTorch program (task " + task.id + "):\n\n```python\n" + ss.str() + "\n```\n\n" + what +
        "\nAnswer with the code in one ```python block.";
  return true;
}

namespace {
void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}
}  // namespace

namespace {
// The template string of `policy` (a named one expanded; "auto" unresolved: chatml).
std::string template_text(const PolicyConfig& policy) {
  std::string t = policy.template_;
  if (t == "chatml" || t == "auto")
    t = "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n";
  else if (t == "llama3")
    t = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
  else if (t == "plain")
    t = "{system}\n\n{user}\n\n";
  return t;
}
}  // namespace

namespace {
// The rendered template before and after the user message ({system} filled; {user} last, so
// that braces inside the task's code are never taken for placeholders).
std::pair<std::string, std::string> around_user(const PolicyConfig& policy) {
  std::string t = template_text(policy);
  replace_all(t, "{system}", policy.system);
  const auto at = t.find("{user}");
  return {t.substr(0, at), t.substr(at + 6)};
}
}  // namespace

std::string render_prompt(const PolicyConfig& policy, const std::string& user) {
  auto [before, after] = around_user(policy);
  return before + user + after;
}

namespace {

// At most `max` characters of `s`: its head and tail, the middle replaced by a note of how much
// was cut (cut at line ends where one is near).
std::string head_tail(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  if (max < 80) return s.substr(0, max);
  const size_t keep = max - 48;  // room for the note
  size_t head = keep / 2, tail = keep - head;
  const size_t nl = s.rfind('\n', head);
  if (nl != std::string::npos && nl > head / 2) head = nl + 1;
  const size_t from = s.size() - tail;
  const size_t nl2 = s.find('\n', from);
  const size_t tail_at = nl2 != std::string::npos && nl2 < from + tail / 2 ? nl2 + 1 : from;
  return s.substr(0, head) + fmt::format("[... {} characters cut ...]\n", tail_at - head) + s.substr(tail_at);
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \n\r\t"), b = s.find_last_not_of(" \n\r\t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

}  // namespace

const char* const refine_instruction =
    "Write an improved version: correct first, then faster than the reference. Answer with the complete code again "
    "in one ```python block.";

std::string feedback_text(const EvalResult& r, size_t max_chars) {
  std::string head, log;  // the verdict, and the log or output that explains it
  const std::string err = trim(r.error);
  const auto& c = r.correctness;
  switch (r.status) {
    case EvalStatus::ok:
      head = fmt::format(
          "The evaluator ran your code: correct on {} of {} trials (largest difference from the reference {:.3g}), "
          "{:.4g} ms against the reference's {:.4g} ms, a speedup of {:.3g}x.",
          c.passed, c.trials, c.max_abs_diff, r.runtime.median_ms, r.ref_runtime.median_ms, r.speedup);
      if (r.kernel_coverage >= 0)
        head += fmt::format(" Your own kernels took {:.0f}% of the GPU time of forward.", 100 * r.kernel_coverage);
      if (r.speedup < 1) head += " It is slower than the reference.";
      break;
    case EvalStatus::format_error:
      head = "The evaluator could not use your answer: " + err;
      break;
    case EvalStatus::compile_error:
      head = "Your code failed to build or import: " + err;
      log = trim(r.compile_log);
      break;
    case EvalStatus::runtime_error:
      head = "Your code raised an error while running: " + err;
      log = trim(r.output);
      break;
    case EvalStatus::timeout:
      head = "Your code did not finish within the evaluator's time limit: " + err;
      break;
    case EvalStatus::incorrect:
      head = fmt::format(
          "Your code ran, but its outputs disagree with the reference: {} (correct on {} of {} trials; largest "
          "absolute difference {:.3g}, relative {:.3g}; tolerances atol {:.3g}, rtol {:.3g}).",
          c.detail.empty() ? err : trim(c.detail), c.passed, c.trials, c.max_abs_diff, c.max_rel_diff, c.atol, c.rtol);
      break;
    case EvalStatus::hacked:
      head = "The evaluator rejected your code for gaming the measurement: " + err;
      break;
    case EvalStatus::out_of_memory:
      head = "The evaluation ran out of device memory: " + err;
      break;
    case EvalStatus::skipped:
      head = "Your code was not evaluated.";
      break;
    case EvalStatus::unconfirmed:
      head = fmt::format(
          "The evaluator ran your code: correct on {} of {} trials, {:.4g} ms against the reference's {:.4g} ms, "
          "a speedup of {:.3g}x that is not believed yet: {}",
          c.passed, c.trials, r.runtime.median_ms, r.ref_runtime.median_ms, r.speedup, trim(r.review));
      break;
  }
  head = head_tail(head, max_chars);
  if (log.empty() || head.size() + 16 >= max_chars) return head;
  return head + "\n```\n" + head_tail(log, max_chars - head.size() - 9) + "\n```";
}

namespace {

struct Markers {
  bool chat = false;          // turn markers of its own; else the attempts go into the one user message
  std::string u2a, a2u, gen;  // user -> assistant (an earlier answer), assistant -> user, user -> generation
};

Markers markers_of(const PolicyConfig& policy) {
  if (policy.model_turns)
    return {true, policy.model_turns->user_to_assistant, policy.model_turns->assistant_to_user,
            policy.model_turns->generation};
  const std::string& t = policy.template_;
  if (t == "chatml" || t == "auto")
    return {true, "<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>\n<|im_start|>user\n",
            "<|im_end|>\n<|im_start|>assistant\n"};
  if (t == "llama3")
    return {true, "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
            "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n",
            "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"};
  if (t == "plain") return {true, "\n\n", "\n\n", "\n\n"};
  return {};
}

std::string render_turns(const PolicyConfig& policy, const std::string& user, const std::vector<Attempt>& history,
                         const std::vector<std::string>& code) {
  const Markers m = markers_of(policy);
  if (!m.chat) {  // a custom template: one user message holding the attempts
    std::string u = user;
    for (size_t k = 0; k < history.size(); ++k)
      u += fmt::format("\n\nYour attempt {}:\n{}\n\n{}\n\n{}", k + 1, code[k], history[k].feedback, refine_instruction);
    return render_prompt(policy, u);
  }
  // The first turn as render_prompt writes it, up to the end of the task's message; then each
  // attempt as the assistant's turn and its feedback as the user's next.
  std::string p = around_user(policy).first + user;
  for (size_t k = 0; k < history.size(); ++k)
    p += m.u2a + code[k] + m.a2u + history[k].feedback + "\n\n" + refine_instruction;
  return p + m.gen;
}

}  // namespace

TurnPrompt render_turn_prompt(const PolicyConfig& policy, const std::string& user, const std::vector<Attempt>& history,
                              size_t budget, const std::function<size_t(const std::string&)>& count_tokens) {
  std::vector<std::string> code;
  for (auto& a : history) code.push_back(a.completion);
  TurnPrompt out;
  out.text = render_turns(policy, user, history, code);
  out.tokens = count_tokens(out.text);
  // The oldest attempts' code first ...
  for (size_t k = 0; out.tokens > budget && k + 1 < history.size(); ++k) {
    code[k] = fmt::format("(the code of attempt {} is left out to fit the context)", k + 1);
    ++out.omitted;
    out.text = render_turns(policy, user, history, code);
    out.tokens = count_tokens(out.text);
  }
  // ... then the middle of the latest, by the characters its tokens over the budget take.
  if (history.empty()) return out;
  std::string& last = code.back();
  const std::string whole = history.back().completion;
  for (int tries = 0; out.tokens > budget && tries < 8; ++tries) {
    const size_t over = out.tokens - budget;
    const size_t last_tokens = std::max<size_t>(1, count_tokens(last));
    const double per_token = double(last.size()) / double(last_tokens);
    const size_t cut = out.cut_chars + size_t(std::ceil(double(over) * per_token * (1.0 + 0.1 * tries))) + 16;
    if (cut >= whole.size()) {
      last = "(the code of the latest attempt is left out to fit the context)";
      out.cut_chars = whole.size();
    } else {
      const size_t head = (whole.size() - cut) / 2;
      last = whole.substr(0, head) + fmt::format("\n[... {} characters cut to fit the context ...]\n", cut) +
             whole.substr(head + cut);
      out.cut_chars = cut;
    }
    out.text = render_turns(policy, user, history, code);
    out.tokens = count_tokens(out.text);
    if (out.cut_chars == whole.size()) break;
  }
  return out;
}

}  // namespace kernelrl

// The prompt a model backend samples from for one task: the task's reference program and what to
// write (by action space), wrapped in the configured chat template ([policy] template, system).
#pragma once

#include "core/config.hpp"
#include "messages/messages.hpp"

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace kernelrl {

struct Task;

// The user message for `task` (its source read from disk), offering the kernel `languages` ("cuda",
// "triton"); false and `err` if it cannot be read.
bool task_user_message(const Task& task, const std::string& action_space, const std::vector<std::string>& languages,
                       std::string& out, std::string& err);

// `user` wrapped in the template, ending where the assistant's answer begins.
std::string render_prompt(const PolicyConfig& policy, const std::string& user);

// The evaluator's verdict on one attempt, as a later turn's prompt shows it to the policy: what
// happened (the status in words, its error, the failing check with its numbers, or the timing,
// speedup and kernel coverage), the compile log or the program's output where they explain it
// (their first and last lines kept), at most `max_chars` characters in all.
std::string feedback_text(const EvalResult& r, size_t max_chars);

// What the policy is asked after each feedback (appended to it in the prompt).
extern const char* const refine_instruction;

// A later turn's prompt: the task's user message, then each earlier attempt of the episode as the
// assistant's turn and its feedback (with refine_instruction) as the user's next turn, in the
// template's own turn markers ("chatml", "llama3", "plain"; a custom template gets the attempts
// inside its one user message), ending where the assistant's answer begins.
// The rule that keeps it within `budget` tokens (count_tokens): while it is longer, the code of the
// oldest attempt whose code is still shown is replaced by a one-line note (its feedback stays);
// once only the latest attempt's code is left, the middle of that code is cut (its head and tail
// kept, the cut marked). The task message is never cut: a prompt whose task alone exceeds the
// budget is returned whole.
struct TurnPrompt {
  std::string text;
  size_t tokens = 0;     // count_tokens(text)
  uint32_t omitted = 0;  // attempts whose code was left out
  size_t cut_chars = 0;  // characters cut from the middle of the latest attempt's code
};
TurnPrompt render_turn_prompt(const PolicyConfig& policy, const std::string& user, const std::vector<Attempt>& history,
                              size_t budget, const std::function<size_t(const std::string&)>& count_tokens);

}  // namespace kernelrl

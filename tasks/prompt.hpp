// The prompt a model backend samples from for one task: the task's reference program and what to
// write (by action space), wrapped in the configured chat template ([policy] template, system).
#pragma once

#include "core/config.hpp"

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

}  // namespace kernelrl

#include "tasks/prompt.hpp"

#include "tasks/task_set.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

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

std::string render_prompt(const PolicyConfig& policy, const std::string& user) {
  std::string t = policy.template_;
  if (t == "chatml")
    t = "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n";
  else if (t == "llama3")
    t = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
  else if (t == "plain")
    t = "{system}\n\n{user}\n\n";
  // {user} last, so that braces inside the task's code are never taken for placeholders.
  replace_all(t, "{system}", policy.system);
  auto at = t.find("{user}");
  return t.substr(0, at) + user + t.substr(at + 6);
}

}  // namespace kernelrl

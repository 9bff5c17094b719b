// launch check CONFIG, launch prompts CONFIG, launch version: what a config says, and what this build is.
#include "launch/commands.hpp"
#include "launch/setup.hpp"
#include "messages/messages.hpp"
#include "policy/runtime_info.hpp"
#include "tasks/task_set.hpp"

#include <nlohmann/json.hpp>
#include <cstdio>
#include <filesystem>

namespace fs = std::filesystem;

namespace kernelrl {

int cmd_check(const std::string& config_path) {
  if (is_comparison_config(config_path)) return cmd_check_comparison(config_path);
  auto cfg = load_or_report(config_path);
  if (!cfg) return 2;
  std::printf("# %s: valid\n%s\n", cfg->source_file.c_str(), cfg->resolved_toml.c_str());
  return 0;
}

int cmd_prompts(const std::string& config_path) {
  auto cfg = load_or_report(config_path);
  if (!cfg) return 2;
  TaskSet tasks, eval_tasks;
  std::vector<RenderedPrompt> prompts;
  std::string err;
  if (!load_experiment_tasks(*cfg, tasks, eval_tasks, err) ||
      !render_task_prompts(*cfg, tasks, eval_tasks, prompts, err)) {
    std::fprintf(stderr, "launch prompts: %s\n", err.c_str());
    return 2;
  }
  for (auto& p : prompts)
    std::printf("%s\n",
                nlohmann::json{{"task_id", p.task_id}, {"split", p.split}, {"prompt", p.prompt}}.dump().c_str());
  return 0;
}

int cmd_version() {
  auto info = torch_runtime_info();
  std::printf("kernelrl %s (protocol %u)\n", KERNELRL_VERSION, protocol_version);
  std::printf("LibTorch %s, CUDA %s (%d device%s)\n", info.version.c_str(),
              info.cuda_available ? "available" : "not available", info.cuda_devices,
              info.cuda_devices == 1 ? "" : "s");
  return 0;
}

}  // namespace kernelrl

// launch check CONFIG, launch prompts CONFIG, launch version: what a config says, and what this build is.
#include "launch/cli.hpp"
#include "launch/commands.hpp"
#include "core/machine.hpp"
#include "wiring/cluster.hpp"
#include "launch/setup.hpp"
#include "wiring/inputs.hpp"
#include "messages/messages.hpp"
#include "policy/runtime_info.hpp"
#include "core/task_set.hpp"

#include <nlohmann/json.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace fs = std::filesystem;

namespace kernelrl {

int cmd_check(const std::string& config_path) {
  if (is_comparison_config(config_path)) return cmd_check_comparison(config_path);
  auto cfg = load_or_report(config_path);
  if (!cfg) return 2;
  // What a run holds at once must fit the machine that holds it (this one, for the head).
  if (std::string why = plan_step(*cfg, machine_memory_mb()).problem(); !why.empty()) {
    std::fprintf(stderr, "launch check: %s: %s\n", cfg->source_file.c_str(), why.c_str());
    return 2;
  }
  std::printf("# %s: valid\n", cfg->source_file.c_str());
  // The candidates' memory, as each node with evaluators would have it on this machine.
  std::string exceeds;
  for (auto& n : cfg->nodes) {
    const auto evaluators = uint32_t(evaluator_devices(n).size());
    if (evaluators == 0 && !n.gpus_auto) continue;
    std::string shared;
    auto plan = node_memory_plan(*cfg, n, &shared);
    std::printf("# node %s on this machine: %s%s%s\n", n.name.c_str(), plan.describe().c_str(), shared.c_str(),
                n.gpus_auto ? " (gpus = \"auto\": counted here as one evaluator)" : "");
    if (exceeds.empty() && plan.exceeds()) exceeds = plan.advice();
  }
  if (!exceeds.empty())
    std::fprintf(stderr,
                 "launch check: warning: the candidates' memory limits add up to more than this machine has for "
                 "them; %s\n",
                 exceeds.c_str());
  std::printf("%s\n", cfg->resolved_toml.c_str());
  return 0;
}

int cmd_prompts(const std::string& config_path) {
  auto cfg = load_or_report(config_path);
  if (!cfg) return 2;
  resolve_chat_template(*cfg);
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

void add_check(CLI::App& app, cli::Action& action) {
  auto config = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  auto* check = cli::subcommand(app, "check",
                                "launch check CONFIG [--set KEY=VALUE ...]\n"
                                "  validate CONFIG and print it resolved (every default filled in); exit 2 on an "
                                "error,\n  each named FILE:LINE:COL");
  check->add_option("CONFIG", *config, "the config to check")->required()->type_name("");
  check->add_option("--set", *sets, "override a key of CONFIG, e.g. --set sampler.temperature=0.8 (repeatable)")
      ->type_name("KEY=VALUE");
  check->callback([&action, config, sets] {
    set_config_overrides(*sets);
    action = [config] { return cmd_check(*config); };
  });
  auto* prompts = cli::subcommand(app, "prompts",
                                  "launch prompts CONFIG\n  print each task's prompt as the sampler renders it (JSON "
                                  "lines)");
  prompts->add_option("CONFIG", *config, "the config whose tasks and template render the prompts")
      ->required()
      ->type_name("");
  prompts->add_option("--set", *sets, "override a key of CONFIG (repeatable)")->type_name("KEY=VALUE");
  prompts->callback([&action, config, sets] {
    set_config_overrides(*sets);
    action = [config] { return cmd_prompts(*config); };
  });
  auto* version =
      cli::subcommand(app, "version", "launch version (or launch --version)\n  versions of kernelrl and LibTorch");
  version->callback([&action] { action = [] { return cmd_version(); }; });
}

}  // namespace kernelrl

// launch export RUN_DIR --jsonl: every sample of a run as one JSON line.
#include "launch/cli.hpp"
#include "launch/commands.hpp"
#include "launch/json.hpp"
#include "launch/setup.hpp"
#include "store/store.hpp"

#include <nlohmann/json.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>

namespace fs = std::filesystem;

namespace kernelrl {

int cmd_export(const std::string& run_dir) {
  int rc = 0;
  auto store = open_run_store("export", run_dir, rc);
  if (!store) return rc;
  for (auto& r : store->samples()) {
    const auto& e = r.record.result;
    nlohmann::json j = result_json(e);
    j.update({
        {"run_id", r.run_id},
        {"sample_id", r.sample_id},
        {"task_id", r.task_id},
        {"step", r.step},
        {"group_id", r.group_id},
        {"sample_index", r.sample_index},
        {"status", r.status},
        {"error", r.error},
        {"speedup", r.speedup},
        {"reward", r.reward},
        {"policy_version", r.policy_version},
        {"num_tokens", r.num_tokens},
        {"logprob_mean", r.logprob_mean},
        {"completion", r.record.rollout.completion},
        {"prompt", r.record.rollout.prompt},
        {"prompt_tokens", r.record.rollout.prompt_tokens},
        {"turn", r.record.rollout.turn},
        {"parent_id", r.record.rollout.parent_id},
        {"token_ids", r.record.rollout.token_ids},
        {"logprobs", r.record.rollout.logprobs},
        {"sampler_id", r.record.rollout.sampler_id},
        {"split", r.record.rollout.split},
        {"assembled_code", e.assembled_code},
        {"compile_log", e.compile_log},
        {"output", e.output},
    });
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}

void add_export(CLI::App& app, cli::Action& action) {
  auto run_dir = std::make_shared<std::string>();
  auto* sub = cli::subcommand(app, "export",
                              "launch export RUN_DIR --jsonl\n  print every sample of a run's store as one JSON line");
  sub->add_option("RUN_DIR", *run_dir, "the run (or its store file)")->required()->type_name("");
  sub->add_flag("--jsonl")->description("JSON lines (the one format)")->required();
  sub->callback([&action, run_dir] { action = [run_dir] { return cmd_export(*run_dir); }; });
}

}  // namespace kernelrl

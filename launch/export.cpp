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
    nlohmann::json j = sample_json(r);
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

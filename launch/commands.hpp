// The subcommands of `launch`. Each returns the process exit code: 0 success, 1 failure,
// 2 bad input (config, arguments).
#pragma once

#include <string>
#include <vector>

namespace kernelrl {

// launch CONFIG [--run-dir DIR] [--log-level LEVEL]
int cmd_run(const std::string& config_path, const std::string& run_dir, const std::string& log_level);
// launch check CONFIG
int cmd_check(const std::string& config_path);
// launch export RUN_DIR --jsonl
int cmd_export(const std::string& run_dir);
// launch version
int cmd_version();

}  // namespace kernelrl

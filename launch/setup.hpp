#pragma once
// What the subcommands that read a config share: loading it (every error printed as
// FILE:LINE:COLUMN), the log level, "auto" devices, the run directory and the store.

#include "analysis/analysis.hpp"
#include "core/config.hpp"
#include "store/store.hpp"
#include "core/task_set.hpp"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kernelrl {

// Loads a config or prints every error (FILE:LINE:COLUMN: key: message) and returns nullopt.
std::optional<Config> load_or_report(const std::string& path);
// [policy] template = "auto": the model's own chat template (tasks/chat_template.py renders its
// pieces with transformers) in place of "auto", or the built-in chatml where the model has none
// or it cannot be used, said in the log either way. Other templates are left as they are.
void resolve_chat_template(Config& cfg);
// The command line's `--set KEY=VALUE` overrides, applied to every config this process loads
// from the command line's CONFIG (a comparison's arms after their tables are merged in).
void set_config_overrides(std::vector<std::string> sets);
const std::vector<std::string>& config_overrides();
// Loads CONFIG, sets the log level (the command line's, else [cluster] log_level) and resolves
// its "auto" devices for this process, and with render_prompts its "auto" chat template (see
// resolve_chat_template); nullopt after printing why not.
std::optional<Config> load_with_level(const std::string& config_path, const std::string& log_level,
                                      bool render_prompts = true);
// Whether every GPU `node` lists for its evaluators exists on this machine (else says which does
// not, on stderr); true when the node lists none.
bool check_listed_gpus(const Config& cfg, const NodeConfig& node);

// How a launch takes its run directory: a new run (a directory whose store already holds the run is
// refused), a resumed learning run, or a service (launch serve) that goes on with the run its
// directory holds.
enum class RunDirUse { fresh, resume, service };

// The run's directory: `arg` (created) or, empty, a new one under [experiment] run_root; locked for
// this process; with workers/, the resolved config (unless resumed) and launch.log. Nullopt after
// logging why not. (launch/run.cpp)
std::optional<std::string> open_run_dir(const Config& cfg, const std::string& config_path, const std::string& arg,
                                        RunDirUse use);

// The store of RUN_DIR (or a store file), read-only, for subcommand `cmd`; null after printing
// why, with rc 2 when there is none and 1 when it cannot be read.
std::unique_ptr<Store> open_run_store(const char* cmd, const std::string& run_dir, int& rc);
// Every sample of a store as the analysis reads it.
std::vector<AnalysisSample> analysis_samples(Store& store);

}  // namespace kernelrl

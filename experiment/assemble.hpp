#pragma once
// The experiment a config describes: its mode, tasks, loop and the settings that make two runs'
// budgets comparable, from the config alone (launch's run command spawns the actors around it).

#include "core/config.hpp"
#include "experiment/experiment.hpp"

#include <string>
#include <vector>

namespace kernelrl {

// The experiment of `cfg` over `task_ids` (and the held-out `eval_task_ids` of a learning mode),
// as run `run_id` in `run_dir`.
ExperimentArgs experiment_args(const Config& cfg, const std::vector<std::string>& task_ids,
                               const std::vector<std::string>& eval_task_ids, const std::string& run_id,
                               const std::string& run_dir);

}  // namespace kernelrl

#include "experiment/assemble.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace kernelrl {

ExperimentArgs experiment_args(const Config& cfg, const std::vector<std::string>& task_ids,
                               const std::vector<std::string>& eval_task_ids, const std::string& run_id,
                               const std::string& run_dir) {
  const ModeTraits& mode = traits(cfg.experiment.mode);
  ExperimentArgs ex;
  ex.run_id = run_id;
  ex.run_dir = run_dir;
  ex.mode = cfg.experiment.mode;
  ex.task_ids = task_ids;
  const uint32_t k = mode.learns ? cfg.learner.group_size : std::max<uint32_t>(1, cfg.sampler.samples_per_task);
  ex.settings = {{"mode", mode.name},
                 {"sampler", cfg.sampler.backend},
                 {"samples_per_task", std::to_string(k)},
                 {"temperature", fmt::format("{:g}", cfg.sampler.temperature)},
                 {"top_p", fmt::format("{:g}", cfg.sampler.top_p)},
                 {"max_tokens", std::to_string(cfg.sampler.max_tokens)},
                 {"eval_mode", cfg.evaluator.mode},
                 {"model", cfg.sampler.backend == "openai" ? cfg.sampler.served_model : cfg.policy.model},
                 {"checkpoint", cfg.policy.adapter},
                 {"replay", cfg.sampler.replay},
                 {"tasks", std::to_string(task_ids.size())}};
  if (cfg.experiment.mode == Mode::sdpo) ex.settings["sdpo_context"] = cfg.sdpo.context;
  ex.turns = cfg.experiment.turns;
  ex.feedback_chars = cfg.experiment.feedback_chars;
  ex.turn_gamma = cfg.learner.turn_gamma;
  ex.turn_progress = cfg.learner.turn_progress;
  ex.learn_last_turn = cfg.learner.learn_turns == "last";
  if (ex.turns > 1) {
    ex.settings["turns"] = std::to_string(ex.turns);
    ex.settings["turn_prompt_tokens"] = std::to_string(cfg.experiment.turn_prompt_tokens);
  }
  if (cfg.experiment.evaluate_top_m > 0) ex.settings["evaluate_top_m"] = std::to_string(cfg.experiment.evaluate_top_m);
  if (!eval_task_ids.empty()) {
    ex.settings["eval_tasks"] = std::to_string(eval_task_ids.size());
    ex.settings["eval_every"] = std::to_string(cfg.experiment.eval_every);
  }
  ex.group_size = k;  // eval and best_of_n: the episodes of a task (multi-turn)
  if (!mode.learns) return ex;
  ex.steps = cfg.learner.steps;
  ex.batch_size = cfg.learner.batch_size;  // ttt and sdpo: every task (experiment/adaptation.cpp)
  ex.group_size = cfg.learner.group_size;
  ex.max_staleness = cfg.learner.max_staleness;
  ex.seed = cfg.experiment.seed;
  ex.patience = cfg.experiment.patience;
  ex.stop_on_regressions = cfg.experiment.early_stop == "regressions";
  ex.eval_task_ids = eval_task_ids;
  ex.eval_every = cfg.experiment.eval_every;
  ex.eval_samples = cfg.experiment.eval_samples ? cfg.experiment.eval_samples : cfg.learner.group_size;
  return ex;
}

}  // namespace kernelrl

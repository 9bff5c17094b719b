#include "wiring/learning.hpp"

#include "actors/checkpoint_selector.hpp"
#include "actors/learner.hpp"
#include "core/files.hpp"
#include "core/log.hpp"
#include "core/paths.hpp"
#include "experiment/experiment.hpp"
#include "learner/lora_learner.hpp"
#include "learner/sdpo.hpp"
#include "tasks/prompt.hpp"

#include <caf/all.hpp>

#include <filesystem>

namespace fs = std::filesystem;

namespace kernelrl {

std::shared_ptr<LearnerEngine> make_engine(const Config& cfg, const std::string& run_dir, bool resume) {
  LearnerOptions lo;
  lo.learner = cfg.learner;
  lo.model_dir = cfg.policy.model;
  lo.adapter_dir = cfg.policy.adapter;
  lo.seed = cfg.experiment.seed;
  lo.temperature = cfg.sampler.temperature;
  lo.objective = traits(cfg.experiment.mode).objective;
  lo.sdpo_beta = cfg.sdpo.beta;
  std::shared_ptr<LearnerEngine> engine = create_learner(lo);
  if (!resume) return engine;
  // The newest checkpoint that is whole (its manifest's sizes and hashes) and loads; a damaged one
  // (a disk that filled while it was written, a file changed since) is passed over, said so.
  auto lg = log::get("launch");
  std::vector<std::string> passed_over;
  auto all = list_checkpoints((fs::path(run_dir) / "checkpoints").string(), &passed_over);
  for (auto& why : passed_over) lg->warn("checkpoint {}; passed over", why);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    std::string why;
    if (fs::exists(fs::path(it->second) / "manifest.json") && !verify_manifest(it->second, true, why)) {
      lg->warn("checkpoint {} is not whole ({}); trying the one before it", it->second, why);
      continue;
    }
    try {
      engine->load_checkpoint(it->second);
    } catch (const std::exception& e) {
      lg->warn("{}; trying the checkpoint before it", e.what());
      continue;
    }
    lg->info("resuming from {} (policy version {})", it->second, engine->version());
    return engine;
  }
  throw std::runtime_error("--resume " + run_dir + ": no checkpoint in " + run_dir + "/checkpoints is whole");
}

LearningActors spawn_learning(caf::actor_system& sys, const Config& cfg,
                              const std::map<std::string, std::string>& user_messages, const std::string& run_dir,
                              std::shared_ptr<LearnerEngine> engine) {
  LearningActors run;
  const auto checkpoints = (fs::path(run_dir) / "checkpoints").string();
  run.selector = spawn_checkpoint_selector(sys, SelectorArgs{checkpoints, cfg.learner.keep_last});
  LearnerArgs la;
  la.engine = std::move(engine);
  la.reject_coverage_below = cfg.reward.reject_coverage_below;
  la.reject_keep_probability = cfg.reward.reject_keep_probability;
  la.reject_seed = cfg.experiment.seed;
  la.selector = run.selector;
  la.checkpoint_dir = checkpoints;
  la.sync_timeout_s = cfg.learner.sync_timeout_s;
  if (cfg.experiment.mode == Mode::sdpo) {
    la.sdpo_enabled = true;
    la.sdpo = cfg.sdpo;
    la.teacher_log = (fs::path(run_dir) / "teacher.jsonl").string();
    la.teacher_prompt = [policy = cfg.policy, users = user_messages](const std::string& task,
                                                                     const std::string& section) {
      auto it = users.find(task);
      return render_prompt(policy, teacher_user_message(it == users.end() ? std::string() : it->second, section));
    };
  }
  run.learner = spawn_learner(sys, la);
  return run;
}

}  // namespace kernelrl

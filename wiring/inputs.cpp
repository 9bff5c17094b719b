#include "wiring/inputs.hpp"

#include "core/files.hpp"
#include "core/log.hpp"
#include "policy/tokenizer.hpp"
#include "tasks/prompt.hpp"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>

namespace kernelrl {

// The config's tasks, and the eval tasks of its periodic evaluation (none without one).
bool load_experiment_tasks(const Config& cfg, TaskSet& tasks, TaskSet& eval_tasks, std::string& err) {
  if (!tasks.load(cfg.tasks, err)) return false;
  if (cfg.experiment.evaluates() && !eval_tasks.load(cfg.experiment.eval_tasks, err)) {
    err = "[experiment] eval: " + err;
    return false;
  }
  return true;
}

// Each task's prompt as the sampler renders it: the tasks, then the eval tasks not among them.
bool render_task_prompts(const Config& cfg, const TaskSet& tasks, const TaskSet& eval_tasks,
                         std::vector<RenderedPrompt>& out, std::string& err) {
  std::set<std::string> seen;
  // The prompts' token counts (compute.json counts them), when the model's tokenizer is at hand.
  std::shared_ptr<Tokenizer> tok;
  if (!cfg.policy.model.empty() &&
      std::filesystem::exists(std::filesystem::path(cfg.policy.model) / "tokenizer.json")) {
    try {
      tok = Tokenizer::load(cfg.policy.model);
    } catch (const std::exception& e) {
      err = cfg.policy.model + "/tokenizer.json: " + e.what();
      return false;
    }
  }
  for (auto* set : {&tasks, &eval_tasks})
    for (auto& t : set->tasks()) {
      if (!seen.insert(t.id).second) continue;  // an eval task that is also a training task
      RenderedPrompt p{t.id, set == &tasks ? "" : "eval", "", "", 0};
      if (!task_user_message(t, cfg.evaluator.action_space, cfg.tasks.languages, p.user, err)) return false;
      p.prompt = render_prompt(cfg.policy, p.user);
      if (tok) p.prompt_tokens = uint32_t(tok->encode(p.prompt).size());
      out.push_back(std::move(p));
    }
  return true;
}
std::string prompts_digest(const std::vector<RenderedPrompt>& prompts) {
  std::vector<const RenderedPrompt*> order;
  for (auto& p : prompts) order.push_back(&p);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->task_id < b->task_id; });
  Sha256 h;  // length-prefixed: no two lists hash alike by moving a boundary
  for (auto* p : order) h.add_sized(p->task_id).add_sized(p->prompt);
  return h.hex();
}

std::vector<std::string> RunInputs::ids(const TaskSet& set) const {
  std::vector<std::string> out;
  for (auto& t : set.tasks()) out.push_back(t.id);
  return out;
}

std::optional<RunInputs> read_inputs(const Config& cfg) {
  auto lg = log::get("launch");
  RunInputs in;
  std::string err;
  if (!load_experiment_tasks(cfg, in.tasks, in.eval_tasks, err)) {
    lg->error("{}", err);
    return std::nullopt;
  }
  size_t shared = 0;
  for (auto& t : in.eval_tasks.tasks()) shared += in.tasks.find(t.id) ? 1 : 0;
  if (shared > 0)
    lg->warn("[experiment] eval: {} of the {} eval tasks are also training tasks: their figures are not held out",
             shared, in.eval_tasks.size());
  if (cfg.sampler.backend != "replay") {
    std::vector<RenderedPrompt> rendered;
    if (!render_task_prompts(cfg, in.tasks, in.eval_tasks, rendered, err)) {
      lg->error("{}", err);
      return std::nullopt;
    }
    for (auto& p : rendered) {
      in.prompts.push_back({p.task_id, p.prompt, p.prompt_tokens, p.user});
      in.user_messages[p.task_id] = p.user;
    }
    in.prompts_digest = prompts_digest(rendered);
    return in;
  }
  std::vector<std::string> replay_errors;
  in.records = load_replay(cfg.sampler.replay, replay_errors);
  for (auto& e : replay_errors) lg->error("{}", e);
  if (!cfg.tasks.ids.empty() || !cfg.tasks.split.empty()) {  // a selection also selects what is replayed
    size_t before = in.records.size();
    std::erase_if(in.records, [&](const ReplayRecord& r) { return !in.tasks.find(r.task_id); });
    if (before != in.records.size())
      lg->info("tasks: {} replayed actions for tasks not selected are left out", before - in.records.size());
  }
  if (in.records.empty()) {
    lg->error("{}: no replay actions to evaluate", cfg.sampler.replay);
    return std::nullopt;
  }
  return in;
}

}  // namespace kernelrl

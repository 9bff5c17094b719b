#pragma once
// An experiment: the logic of one mode as plain C++, without actors. The supervisor actor feeds it
// what happens (the run starts, a sample is stored, the sampler planned, the learner updated) and
// carries out the actions it answers with, in order; everything the run decides (which tasks are
// sampled, when a step is complete, which group is stale, Best-of-Adaptation, early stopping,
// held-out rounds, when the run is over) is decided here.
//
//   eval, best_of_n:  SampleAll (experiment/sample_all.cpp): the sampler's own plan of every task, K
//                     samples each; done when every sample has a verdict. With turns > 1:
//                     Refinement (experiment/refinement.cpp), K episodes of T turns a task.
//   train:            Training (experiment/training.cpp): RLVR over batches of a shuffled task sequence.
//   ttt, sdpo:        Adaptation (experiment/adaptation.cpp): train's loop on every task every step
//                     (the learner's objective tells sdpo from ttt).
// A new mode is one new type (a file) behind this interface and its case in make_experiment().

#include "core/mode.hpp"
#include "experiment/scores.hpp"
#include "messages/messages.hpp"
#include "store/store.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace kernelrl {

// What an experiment is given: the run, its tasks and the learning loop's settings.
struct ExperimentArgs {
  std::string run_id;                 // id of the run in the store
  std::string run_dir;                // RUN_DIR (its checkpoints/ hold the learner's adapters)
  Mode mode = Mode::eval;             // [experiment] mode
  std::vector<std::string> task_ids;  // tasks of the experiment, in order
  // learning modes
  uint32_t steps = 0;                // [learner] steps
  uint32_t batch_size = 8;           // tasks per step (ttt and sdpo: every task)
  uint32_t group_size = 8;           // samples per task per step
  uint32_t max_staleness = 0;        // [learner] max_staleness
  uint64_t seed = 0;                 // task order
  uint32_t patience = 0;             // early stopping (AdaptationTracker)
  bool stop_on_regressions = false;  // its rule: patience consecutive regressions
  // Periodic evaluation on held-out tasks (empty: none): the first version served, every
  // eval_every-th and the last, each with eval_samples samples per task.
  std::vector<std::string> eval_task_ids;
  uint32_t eval_every = 0;
  uint32_t eval_samples = 1;
  // Multi-turn episodes (train, ttt, eval, best_of_n): turns per episode, the feedback's length
  // limit, and the discount of the returns a learning mode learns from.
  uint32_t turns = 1;
  uint32_t feedback_chars = 2000;
  double turn_gamma = 1.0;
  double turn_progress = 0.0;    // a later turn's bonus for its progress over the turn before
  bool learn_last_turn = false;  // only the last turn's groups go to the learner
  // What makes two runs' budgets comparable (K, temperature, max_tokens, eval mode, checkpoint),
  // written with the run's compute into RUN_DIR/compute.json.
  std::map<std::string, std::string> settings;
};

// The actions an experiment asks of the actors; the supervisor carries them out in order.
namespace act {
struct Sample {  // ask the sampler for these groups; its answer (how many samples) goes to planned()
  SamplePlan plan;
};
struct SampleAll {};  // ask the sampler to plan every task itself (eval, best_of_n)
struct LearnStep {    // tell the learner that step `step` has `groups` groups; its update goes to updated()
  uint32_t step = 0;
  uint64_t groups = 0;
};
struct Learn {  // one accepted sample for the learner
  ScoredRollout sample;
  bool last = false;  // its group's last: the group is complete (the learner counts nothing itself)
};
struct StepDone {  // a step's samples are all in: store its row, score its checkpoint in the selector
  StepStats stats;
};
struct StepLearned {  // the learner's update of a complete step: its row again with the learner's figures
  StepStats stats;
  std::map<std::string, double> learner;
  Checkpoint checkpoint;  // the adapter that sampled the step, scored by the step's fast_1
};
struct Keep {  // the selector keeps this version's checkpoint (a held-out round scores it)
  uint64_t version = 0;
};
struct Finish {  // the run is over ("" ok, else why it failed)
  std::string error;
};
}  // namespace act
using Action = std::variant<act::Sample, act::SampleAll, act::LearnStep, act::Learn, act::StepDone, act::StepLearned,
                            act::Keep, act::Finish>;
using Actions = std::vector<Action>;

// A run's totals over every stored sample: counts, compute, staleness and the speedup and reward
// distributions (what the summary and the telemetry report in every mode).
struct RunTotals {
  uint64_t expected = 0, recorded = 0;  // samples planned so far, and stored
  bool planned = false;                 // the first plan is answered: `expected` means something
  std::map<std::string, uint64_t> status_counts;
  std::map<std::string, TaskAgg> tasks;
  std::vector<double> speedups;       // of correct samples
  std::vector<uint64_t> reward_hist;  // counts per reward_bin()
  uint32_t step = 0;                  // latest step a sample belongs to
  uint64_t policy_version = 0;        // newest policy version seen in a sample
  uint64_t stale_max = 0, stale_sum = 0;
  uint64_t eval_rollouts = 0;          // samples of held-out rounds (Rollout::split not empty)
  uint64_t student_tokens = 0;         // completion tokens
  uint64_t student_prompt_tokens = 0;  // prompt tokens, each sample counting its prompt
  double eval_wall_s = 0, eval_device_s = 0, compile_s = 0;
  double t_start = 0, t_first_record = -1, t_last_record = -1;  // mono_s
  // Counts a sample's compute; its scores only when it is the experiment's (not a held-out round's).
  void count(const ScoredRollout& s, double now);
};

class Experiment {
 public:
  explicit Experiment(ExperimentArgs args);
  virtual ~Experiment() = default;
  const ExperimentArgs& args() const { return args_; }
  const RunTotals& totals() const { return totals_; }
  bool finished() const { return finished_; }

  // The run starts. `version`: the policy version the learner published (0 when nothing learns);
  // `earlier`: a resumed run's stored samples and step rows (empty for a new run).
  virtual Actions start(uint64_t version, const std::vector<ScoredRollout>& earlier,
                        const std::vector<Store::StepRow>& earlier_steps) = 0;
  // The sampler answered an act::Sample or act::SampleAll: `n` samples are coming.
  virtual Actions planned(uint64_t n) = 0;
  // A new sample is stored.
  virtual Actions sampled(const ScoredRollout& s) = 0;
  // The learner's update of a step (learning modes).
  virtual Actions updated(const StepUpdate& u);
  // The run ends (`error` empty: completed): its summary as `launch` prints it. `step_rows` are
  // the store's rows of this run (steps with their learner figures).
  virtual nlohmann::json summary(const std::string& error, const std::vector<Store::StepRow>& step_rows);
  // The row to store for the whole run when it ends, if the mode keeps one (step 0 of eval modes).
  virtual std::optional<StepStats> final_row() const { return std::nullopt; }
  // Live figures for the monitor ("supervisor.KEY").
  virtual std::map<std::string, double> telemetry() const;
  // Every sample planned so far has a verdict (nothing more is awaited from the evaluators).
  bool all_in() const { return totals_.planned && totals_.recorded >= totals_.expected; }
  uint64_t outstanding() const { return totals_.expected > totals_.recorded ? totals_.expected - totals_.recorded : 0; }
  // The run is over (the supervisor ended it): nothing more is planned.
  void halt() { finished_ = true; }

 protected:
  // Ends the run from within: nothing more is planned, and the supervisor finishes it.
  Actions finish(std::string error) {
    finished_ = true;
    return {act::Finish{std::move(error)}};
  }

  ExperimentArgs args_;
  RunTotals totals_;
  bool finished_ = false;
};

// The experiment of args.mode.
std::unique_ptr<Experiment> make_experiment(ExperimentArgs args);

// The summary's per-task rows: the tasks of `order`, then any other task that has samples.
nlohmann::json tasks_json(const std::vector<std::string>& order, const std::map<std::string, TaskAgg>& tasks);

}  // namespace kernelrl

#pragma once
// The learning loop (train, ttt, sdpo). The learner publishes its weights first; then step s asks
// the sampler for group_size samples of each of batch_size tasks and tells the learner how many
// groups to expect. Each complete group goes to the learner unless a sample in it is staler than
// max_staleness versions behind the newest policy: then the group is rejected, reported, and the
// task sampled again. Step s+1 is planned once the learner's update of step s - max_staleness is
// acknowledged. A learner error ends the run. Best-of-Adaptation (the step whose samples scored
// the best fast_1, and its checkpoint) and early stopping after `patience` steps without
// improvement; held-out rounds (experiment/held_out.hpp) at the versions they name, the run ending
// once the last one is in.
// Resumed, the run continues from the learner's version: the stored samples of earlier steps are
// counted once, complete and fresh groups of the resumed step are reused, the rest abandoned.
// Multi-turn (turns T > 1): each of a step's tasks is group_size episodes of T turns. Turn 1 is
// planned with the step; turn t + 1 of a task once its turn t group is in, each sample's prompt
// showing its episode's earlier attempts and their feedback; each turn is a group of its own (its
// own group id). Once the last turn is in, the T groups go to the learner together, each sample
// learning from its return r_t + turn_gamma * G_{t+1}, a later turn's plus [learner]
// turn_progress times its gain over the turn before (with rloo or trloo: TRLOO), the step
// counting T groups a task. A stale turn makes the whole episode set stale (sampled again from turn
// 1); a resumed run abandons the resumed step's multi-turn samples and samples the step again.

#include "experiment/adaptation.hpp"
#include "experiment/experiment.hpp"
#include "experiment/held_out.hpp"

#include <map>
#include <string>
#include <vector>

namespace kernelrl {

class Training : public Experiment {
 public:
  explicit Training(ExperimentArgs args);
  Actions start(uint64_t version, const std::vector<ScoredRollout>& earlier,
                const std::vector<Store::StepRow>& earlier_steps) override;
  Actions planned(uint64_t n) override;
  Actions sampled(const ScoredRollout& s) override;
  Actions updated(const StepUpdate& u) override;
  nlohmann::json summary(const std::string& error, const std::vector<Store::StepRow>& step_rows) override;
  std::map<std::string, double> telemetry() const override;

  static constexpr uint64_t group_stride = HeldOutRounds::group_stride;  // group ids of step s: s * stride + j

 protected:
  // The task that group k of step s samples: a deterministic shuffle of the task set per epoch.
  virtual const std::string& task_for(uint32_t step, uint32_t k) const;

 private:
  struct Group {
    std::string task_id;
    uint32_t step = 0;
    std::vector<ScoredRollout> samples;
    bool stale = false;                               // a sample was staler than allowed: the group is rejected
    uint64_t stale_version = 0;                       // the stale sample's version
    uint32_t replans = 0;                             // how often this task was sampled again in this step
    uint32_t turn = 0;                                // multi-turn: the turn it samples (1..T)
    std::vector<std::vector<ScoredRollout>> earlier;  // multi-turn: the turns before it, in order
  };
  struct Step {
    uint64_t groups = 0, accepted = 0;  // planned, and complete and accepted
    uint64_t next_j = 0;                // next group number in this step
    std::map<std::string, TaskAgg> tasks;
    std::map<std::string, uint64_t> status_counts;
    uint64_t version = 0;  // newest version among its accepted samples
    bool written = false;  // complete: its stats are final
    StepStats stats;
  };
  void resume(const std::vector<ScoredRollout>& earlier, const std::vector<Store::StepRow>& earlier_steps);
  void plan_more(Actions& out);
  void plan_step(uint32_t s, Actions& out);
  void accept_group(uint32_t s, std::vector<ScoredRollout>& samples, Actions& out,
                    const std::vector<double>* learned = nullptr, bool learn = true);
  void accept_episodes(uint32_t s, std::vector<std::vector<ScoredRollout>>& turns, Actions& out);
  void next_turn(uint64_t gid, Group& g, Actions& out);
  bool multi_turn() const { return args_.turns > 1; }
  // Turns of an episode the learner learns from, the last ones: all, or the last under
  // [learner] learn_turns = "last".
  uint32_t learned_turns() const { return multi_turn() && args_.learn_last_turn ? 1 : args_.turns; }
  void end_learning(Actions& out);
  Actions record(const ScoredRollout& s);

  HeldOutRounds held_out_;
  AdaptationTracker tracker_;
  std::map<uint64_t, Group> groups_;  // open groups by group id
  std::map<uint32_t, Step> steps_;
  std::map<std::string, std::vector<std::vector<ScoredRollout>>> reusable_;    // resume: complete groups by task
  std::map<std::string, std::vector<std::vector<ScoredRollout>>> unfinished_;  // resume: groups to complete
  uint32_t next_plan_ = 0;                                                     // next step to plan
  uint64_t version_ = 0;        // the learner's newest acknowledged version
  uint64_t first_version_ = 0;  // the version the run started (or resumed) from
  uint64_t stale_rejected_ = 0, groups_replanned_ = 0, abandoned_ = 0, resumed_samples_ = 0;
  double last_step_fast_1_ = -1;
  bool stopped_early_ = false;
  bool ending_ = false;   // learning is over; the run ends once the held-out rounds are in
  double t_synced_ = -1;  // mono_s when it started sampling
};

// ttt and sdpo: train's loop on every task of the set each step (the batch is the task set).
class Adaptation : public Training {
 public:
  explicit Adaptation(ExperimentArgs args);

 protected:
  const std::string& task_for(uint32_t step, uint32_t k) const override;
};

}  // namespace kernelrl

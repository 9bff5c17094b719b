#pragma once
// eval and best_of_n with multi-turn episodes ([experiment] turns = T > 1): sequential test-time
// scaling. Each task is K episodes (K samples per task) of T turns; turn 1 samples the task's
// prompt; turn t + 1 of a task is planned once its turn t group is in, each sample's prompt
// showing its episode's earlier attempts and the evaluator's feedback on each. Nothing learns;
// the run is done when every task's last turn is in. The whole run is step 0 of the steps
// table; `launch analyze` shows fast_1 per turn and the best-so-far over the turns.

#include "experiment/sample_all.hpp"

#include <map>
#include <string>
#include <vector>

namespace kernelrl {

// SampleAll's final row (the whole run as step 0); its own plans, turn by turn.
class Refinement : public SampleAll {
 public:
  using SampleAll::SampleAll;
  Actions start(uint64_t version, const std::vector<ScoredRollout>& earlier,
                const std::vector<Store::StepRow>& earlier_steps) override;
  Actions planned(uint64_t n) override;
  Actions sampled(const ScoredRollout& s) override;
  nlohmann::json summary(const std::string& error, const std::vector<Store::StepRow>& step_rows) override;

 private:
  struct Group {
    std::string task_id;
    uint32_t turn = 1;
    std::vector<ScoredRollout> samples;
    std::vector<std::vector<ScoredRollout>> earlier;  // the turns before, in order (by sample index)
  };
  uint32_t k() const { return args_.group_size; }
  std::map<uint64_t, Group> groups_;  // open groups by group id
  uint64_t next_gid_ = 0;
  size_t tasks_done_ = 0;
};

}  // namespace kernelrl

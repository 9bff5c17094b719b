#pragma once
// eval and best_of_n: the sampler plans every task itself (K samples each, or each replayed
// action); the run is done when every planned sample has a verdict. Nothing learns.

#include "experiment/experiment.hpp"

namespace kernelrl {

class SampleAll : public Experiment {
 public:
  using Experiment::Experiment;
  Actions start(uint64_t version, const std::vector<ScoredRollout>& earlier,
                const std::vector<Store::StepRow>& earlier_steps) override;
  Actions planned(uint64_t n) override;
  Actions sampled(const ScoredRollout& s) override;
  // The whole run is step 0 of the steps table.
  std::optional<StepStats> final_row() const override;
};

}  // namespace kernelrl

#include "experiment/sample_all.hpp"

#include "core/log.hpp"
#include "core/paths.hpp"

namespace kernelrl {

Actions SampleAll::start(uint64_t, const std::vector<ScoredRollout>&, const std::vector<Store::StepRow>&) {
  return {act::SampleAll{}};
}

Actions SampleAll::planned(uint64_t n) {
  totals_.planned = true;
  totals_.expected = n;
  log::get("supervisor")->info("{}: {} samples to evaluate", name(args_.mode), n);
  return all_in() ? finish("") : Actions{};
}

Actions SampleAll::sampled(const ScoredRollout& s) {
  totals_.count(s, mono_s());
  return !finished_ && all_in() ? finish("") : Actions{};
}

std::optional<StepStats> SampleAll::final_row() const {
  StepStats s = stats_of(totals_.tasks, totals_.status_counts, 0);
  if (s.samples == 0) return std::nullopt;
  return s;
}

}  // namespace kernelrl

#include "experiment/adaptation.hpp"

#include "experiment/training.hpp"

#include <random>
#include <utility>
#include <vector>

namespace kernelrl {

bool AdaptationTracker::record(uint32_t step, double score) {
  falling = any && score < last ? falling + 1 : 0;
  last = score;
  if (!any || score > best) {
    best = score;
    best_step = step;
    since_best = 0;
  } else {
    ++since_best;
  }
  any = true;
  return patience > 0 && (regressions ? falling : since_best) >= patience;
}

size_t train_task_index(uint64_t seed, size_t n, uint64_t i) {
  const uint64_t epoch = i / n;
  std::vector<size_t> perm(n);
  for (size_t k = 0; k < n; ++k) perm[k] = k;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + epoch);
  for (size_t k = n; k > 1; --k) std::swap(perm[k - 1], perm[size_t(rng() % k)]);  // Fisher-Yates
  return perm[i % n];
}

// ttt and sdpo: the batch of every step is the whole task set, in order.
namespace {
ExperimentArgs every_task_each_step(ExperimentArgs a) {
  a.batch_size = uint32_t(a.task_ids.size());
  return a;
}
}  // namespace

Adaptation::Adaptation(ExperimentArgs args) : Training(every_task_each_step(std::move(args))) {}

const std::string& Adaptation::task_for(uint32_t, uint32_t k) const {
  return args_.task_ids[k % args_.task_ids.size()];
}

}  // namespace kernelrl

#include "experiment/adaptation.hpp"

#include <random>
#include <utility>
#include <vector>

namespace kernelrl {

bool AdaptationTracker::record(uint32_t step, double score) {
  if (!any || score > best) {
    best = score;
    best_step = step;
    since_best = 0;
  } else {
    ++since_best;
  }
  any = true;
  return patience > 0 && since_best >= patience;
}

size_t train_task_index(uint64_t seed, size_t n, uint64_t i) {
  const uint64_t epoch = i / n;
  std::vector<size_t> perm(n);
  for (size_t k = 0; k < n; ++k) perm[k] = k;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + epoch);
  for (size_t k = n; k > 1; --k) std::swap(perm[k - 1], perm[size_t(rng() % k)]);  // Fisher-Yates
  return perm[i % n];
}

}  // namespace kernelrl

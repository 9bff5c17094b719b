// Analysis of a run's samples (torch-free): fast_p, correctness, speedups, per step and per task;
// pass@k and fast_1@k with the unbiased estimator and bootstrap confidence intervals (the scaling
// curve over k); Spearman's rho of a sample's mean logprob against its speedup, raw and partial on
// length; surprisal quartiles. `launch analyze RUN_DIR` prints it; tests/test_analysis.py checks
// every figure against an independent numpy computation.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kernelrl {

struct AnalysisSample {
  std::string task_id;
  uint32_t step = 0;
  bool correct = false;       // status ok
  double speedup = 0;         // 0 unless correct
  double reward = 0;
  double logprob_mean = 0;    // mean per-token logprob under the sampling policy
  uint32_t num_tokens = 0;    // completion tokens (0: unknown, e.g. replayed text)
};

struct AnalysisOptions {
  std::vector<double> p{1.0, 1.2};  // fast_p thresholds: correct and speedup > p
  std::vector<uint32_t> ks;         // pass@k / fast_1@k (empty: 1, 2, 4, ... up to the smallest task)
  uint32_t bootstrap = 1000;        // resamples of the tasks for the confidence intervals (0: none)
  double confidence = 0.95;
  uint64_t seed = 0;
};

// 1 - C(n - c, k) / C(n, k): the probability that at least one of k samples drawn without
// replacement from n, of which c succeed, succeeds (the unbiased pass@k estimator). k <= n.
double pass_at_k(uint64_t n, uint64_t c, uint64_t k);

// Spearman's rank correlation (average ranks for ties); NaN when either side is constant.
double spearman(const std::vector<double>& x, const std::vector<double>& y);
// Spearman's rho of x and y with z partialled out (partial correlation of the ranks).
double partial_spearman(const std::vector<double>& x, const std::vector<double>& y, const std::vector<double>& z);

// Everything above as one JSON object. `learner` maps a step to its learner figures (loss, ...)
// and is merged into "steps".
nlohmann::json analyze(const std::vector<AnalysisSample>& samples, const AnalysisOptions& o,
                       const std::map<uint32_t, std::map<std::string, double>>& learner = {});

}  // namespace kernelrl

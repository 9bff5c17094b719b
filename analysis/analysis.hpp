// Analysis of a run's samples (torch-free): fast_p, correctness, speedups, per step and per task;
// pass@k and fast_1@k with the unbiased estimator and bootstrap confidence intervals (the scaling
// curve over k); Spearman's rho of a sample's mean logprob against its speedup, raw and partial on
// length; surprisal quartiles; selection strategies over each task's samples of a step
// (best-of-N). `launch analyze RUN_DIR` prints it; tests/e2e/test_analysis.py checks every figure
// against an independent numpy computation.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kernelrl {

struct AnalysisSample {
  bool evaluated = true;  // false: left out before evaluation (status skipped): it counts in
                          // no rate, only in the deployable top-m's ranking
  std::string task_id;
  uint32_t step = 0;
  bool correct = false;  // status ok or unconfirmed
  double speedup = 0;    // 0 unless correct; an unconfirmed verdict's at most 1 (not counted faster)
  double reward = 0;
  double logprob_mean = 0;  // mean per-token logprob under the sampling policy
  uint32_t num_tokens = 0;  // completion tokens (0: unknown, e.g. replayed text)
  std::string split;        // "eval": a train run's periodic evaluation on held-out tasks (`step`
                            // is the policy version evaluated); analysed apart, under "eval"
  bool hacked = false;      // status hacked: caught gaming the harness (counts in hacked_share)
  // Multi-turn episodes: the turn (0: single-turn), the sample's id and its parent's (the turn
  // before in its episode), and whether it was a format error.
  uint32_t turn = 0;
  std::string sample_id, parent_id;
  bool format_error = false;
  bool unconfirmed = false;  // status unconfirmed: a speedup awaiting `launch confirm` (unconfirmed_share)
};

struct AnalysisOptions {
  std::vector<double> p{1.0, 1.2};  // fast_p thresholds: correct and speedup > p
  std::vector<uint32_t> ks;         // pass@k / fast_1@k (empty: 1, 2, 4, ... up to the smallest task)
  uint32_t bootstrap = 1000;        // resamples of the tasks for the confidence intervals (0: none)
  double confidence = 0.95;
  uint64_t seed = 0;
  uint32_t m = 4;  // selection strategies' top-m
};

// 1 - C(n - c, k) / C(n, k): the probability that at least one of k samples drawn without
// replacement from n, of which c succeed, succeeds (the unbiased pass@k estimator). k <= n.
double pass_at_k(uint64_t n, uint64_t c, uint64_t k);

// Spearman's rank correlation (average ranks for ties); NaN when either side is constant.
double spearman(const std::vector<double>& x, const std::vector<double>& y);
// Spearman's rho of x and y with z partialled out (partial correlation of the ranks).
double partial_spearman(const std::vector<double>& x, const std::vector<double>& y, const std::vector<double>& z);
// The two-sided p-value of a rank correlation rho over n pairs with `covariates` variables
// partialled out, by the t approximation (t = rho sqrt(df / (1 - rho^2)), df = n - 2 - covariates,
// Student's t with df degrees of freedom), as scipy.stats.spearmanr reports it; 0 when |rho| = 1,
// NaN when rho is NaN or df < 1.
double spearman_p_value(double rho, size_t n, int covariates = 0);
// The two-sided p-value P(|T| >= |t|) of Student's t with df > 0 degrees of freedom (df need not
// be whole: Welch's test); 0 for an infinite t, NaN for a NaN t or df <= 0.
double student_t_p_value(double t, double df);
// Tests of one arm against another over seeds (scores a[i], b[i]; paired by index where both
// exist): the paired t-test on the differences, Welch's unequal-variance t-test, and the exact
// sign-flip permutation test of the paired differences (every one of the 2^n sign patterns, n <=
// 20; NaN beyond). Each p is two-sided; NaN where it is undefined (fewer than two seeds).
struct SeedTests {
  size_t n = 0;                // paired seeds
  double mean_difference = 0;  // mean of a - b over the pairs
  double paired_t = 0, paired_p = 0;
  double welch_t = 0, welch_df = 0, welch_p = 0;
  double sign_flip_p = 0;
};
SeedTests seed_tests(const std::vector<double>& a, const std::vector<double>& b);
// The regularized incomplete beta function I_x(a, b) (a, b > 0, 0 <= x <= 1).
double incomplete_beta(double a, double b, double x);

// Selection strategies over the K samples of one task (one group of a best-of-N step). Each
// picks one sample, or none:
//   oracle            the fastest correct sample
//   random_correct    a correct sample drawn uniformly (its expectation is reported, not a draw)
//   confidence        the correct sample with the highest mean logprob
//   surprisal         the correct sample with the lowest mean logprob
//   surprisal_top_m   the fastest of the m correct samples with the lowest mean logprob
//   deployable_top_m  ranks all K by mean logprob before any evaluation, evaluates only the m
//                     lowest, keeps the fastest correct one (needs m evaluations, not K). A run
//                     with [experiment] evaluate_top_m = m did exactly that: its other samples are
//                     stored unevaluated (status skipped) and only this strategy applies in full.
// Logprob strategies are left out of groups where a sample has no tokens.
struct Selection {
  double fast_1 = 0;         // chance that the pick is correct and faster than the reference
  double correct = 0;        // chance that there is a correct pick
  double speedup = 0;        // expected speedup of the pick (0 when there is none)
  uint32_t evaluations = 0;  // samples the strategy needs evaluated
  bool applicable = false;
};
std::map<std::string, Selection> select_group(const std::vector<AnalysisSample>& group, uint32_t m);

// The k at which a scaling curve (points (k, value) in increasing k, values non-decreasing, e.g.
// fast_1@k) first reaches `target`, interpolated linearly between points; NaN when the curve never
// reaches it; -infinity when `target` is below the first point (fewer samples than its k would
// do: the seeds' "< 1"); the first point's k when `target` equals its value.
double equivalent_k(const std::vector<std::pair<double, double>>& curve, double target);

// The mean of a sample's token logprobs, summed in double as the store computes it (0 for none).
double mean_logprob(const std::vector<float>& logprobs);
// Indices of `means` (mean logprobs) from the most surprising (lowest) to the least; ties keep
// index order. The deployable top-m ranks a group by this before any evaluation.
std::vector<size_t> surprisal_order(const std::vector<double>& means);

// Everything above as one JSON object: the run's summary, "steps", "per_task", "per_step_task"
// (each task's figures per step: TTT trajectories), "at_k", "logprob_vs_speedup", "selection";
// for multi-turn runs "turns": per turn its samples' figures, their format errors and how many of
// the samples after a format error are none, and the best so far (each sample standing for the
// best of its episode's turns up to it: correct if any was, its best speedup).
// `learner` maps a step to its learner figures (loss, ...) and is merged into "steps". Samples
// of a periodic evaluation (split "eval") are in none of these: "eval" is the same analysis of
// them alone, its "steps" being the versions evaluated.
nlohmann::json analyze(const std::vector<AnalysisSample>& samples, const AnalysisOptions& o,
                       const std::map<uint32_t, std::map<std::string, double>>& learner = {});

}  // namespace kernelrl

// analysis/: the statistics that have closed forms elsewhere, against values computed with mpmath
// (30 digits; the expressions are in each case's comment). The rest of the analysis is checked
// against numpy in tests/e2e/test_analysis.py; the comparison's budget matching against its own formula.
#include "analysis/analysis.hpp"
#include "analysis/comparison.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <map>

using namespace kernelrl;

TEST_CASE("the regularized incomplete beta function equals mpmath's betainc", "[analysis]") {
  // mpmath.betainc(a, b, 0, x, regularized=True)
  CHECK(incomplete_beta(0.5, 0.5, 0.3) == Approx(0.36901011956554538).epsilon(1e-13));
  CHECK(incomplete_beta(5, 0.5, 0.9) == Approx(0.31664291502001231).epsilon(1e-13));
  CHECK(incomplete_beta(100, 0.5, 0.99) == Approx(0.15677586542444078).epsilon(1e-12));
  CHECK(incomplete_beta(2.5, 7, 0.2) == Approx(0.36749651990402307).epsilon(1e-13));
  CHECK(incomplete_beta(2, 3, 0) == 0);
  CHECK(incomplete_beta(2, 3, 1) == 1);
  CHECK(std::isnan(incomplete_beta(0, 3, 0.5)));
  CHECK(std::isnan(incomplete_beta(2, 3, 1.5)));
}

TEST_CASE("Spearman p-values by the t approximation equal mpmath's", "[analysis]") {
  // p = betainc(df / 2, 1/2, 0, df / (df + t^2), regularized=True), t^2 = r^2 df / (1 - r^2), df = n - 2
  CHECK(spearman_p_value(0.3, 12) == Approx(0.34343857105468752).epsilon(1e-12));
  CHECK(spearman_p_value(0.999, 52) == Approx(3.7241002997007454e-69).epsilon(1e-9));
  CHECK(spearman_p_value(0.01, 3002) == Approx(0.58390436152219202).epsilon(1e-12));
  CHECK(spearman_p_value(-0.6, 3) == Approx(0.59033447060173311).epsilon(1e-12));
  CHECK(spearman_p_value(0.05, 200000) == Approx(6.9681505292474297e-111).epsilon(1e-8));
  CHECK(spearman_p_value(0.9, 5) == Approx(0.037386073468498633).epsilon(1e-12));
  // one covariate partialled out: df = n - 3
  CHECK(spearman_p_value(0.9, 6, 1) == Approx(0.037386073468498633).epsilon(1e-12));
  CHECK(spearman_p_value(1.0, 10) == 0);
  CHECK(std::isnan(spearman_p_value(0.5, 2)));  // no degree of freedom
  CHECK(std::isnan(spearman_p_value(std::nan(""), 10)));
}

TEST_CASE("Student's t p-values and the tests over seeds equal mpmath's and a direct enumeration", "[analysis]") {
  CHECK(student_t_p_value(2.5, 3) == Approx(0.087706647008065547).epsilon(1e-12));
  CHECK(student_t_p_value(-1.2, 4.7) == Approx(0.28710945873298567).epsilon(1e-12));  // a Welch df
  CHECK(student_t_p_value(INFINITY, 3) == 0);
  CHECK(std::isnan(student_t_p_value(1, 0)));
  // scores of arm a and arm b over four seeds (numpy for t and Welch's df, mpmath for the p-values,
  // the 16 sign patterns for the sign-flip test)
  auto r = seed_tests({0.5, 0.7, 0.6, 0.9}, {0.4, 0.5, 0.65, 0.6});
  CHECK(r.n == 4);
  CHECK(r.mean_difference == Approx(0.1375));
  CHECK(r.paired_t == Approx(1.841880388213626).epsilon(1e-12));
  CHECK(r.paired_p == Approx(0.16273310982429386).epsilon(1e-10));
  CHECK(r.welch_t == Approx(1.3506000899655952).epsilon(1e-12));
  CHECK(r.welch_df == Approx(5.147220657683808).epsilon(1e-12));
  CHECK(r.welch_p == Approx(0.23316477959866688).epsilon(1e-10));
  CHECK(r.sign_flip_p == 0.25);
  auto same = seed_tests({0.5, 0.5}, {0.5, 0.5});  // no difference and no spread: nothing to reject
  CHECK(same.paired_p == 1);
  CHECK(same.welch_p == 1);
  auto one = seed_tests({0.5}, {0.4});  // one seed: no test
  CHECK(std::isnan(one.paired_p));
  CHECK(std::isnan(one.welch_p));
}

namespace {
// A finished run as launch compare loads it: its compute.json's budget and the analysis fields
// the comparison reads (a fast_1@k curve of k = 1..K for independent draws, turns for multi-turn).
ComparedRun compared(const std::string& dir, uint64_t tasks, uint64_t rollouts, uint64_t tokens, int curve_k,
                     bool multi_turn) {
  ComparedRun r;
  r.dir = dir;
  r.compute = {{"rollouts", rollouts}, {"student_tokens", tokens}, {"settings", {{"temperature", "0.8"}}}};
  r.analysis = {{"tasks", tasks}, {"at_k", nlohmann::json::array()}, {"fast_1", 0.1}, {"correct_rate", 0.5}};
  for (int k = 1; k <= curve_k; ++k) r.analysis["at_k"].push_back({{"k", k}, {"fast_1", 1 - std::pow(0.8, k)}});
  if (multi_turn) r.analysis["turns"] = nlohmann::json::array({{{"turn", 1}}, {{"turn", 2}}});
  return r;
}
}  // namespace

TEST_CASE("sequential refinement is read on best-of-N's curve at equal rollouts and at equal tokens", "[analysis]") {
  // Best-of-N: 8 samples a task over 3 tasks, 100 tokens a sample. Refinement: 4 rollouts a task, 700 tokens a task
  // (its later turns carry the conversation): as many tokens as 7 of best-of-N's samples.
  std::vector<ComparedRun> runs = {compared("bon", 3, 24, 2400, 8, false), compared("refine", 3, 12, 2100, 1, true)};
  CHECK(draws(runs[0]));
  CHECK_FALSE(draws(runs[1]));
  CHECK(sequential(runs[1]));
  CHECK(budget_differences(runs).empty());  // unequal raw rollouts, both budgets within the curve
  Comparison c = compare_runs(runs);
  REQUIRE(c.curve == &runs[0]);
  CHECK(c.matched(runs[0]).is_null());
  auto m = c.matched(runs[1]);
  CHECK(m["k_rollouts"].get<double>() == Approx(4));
  CHECK(m["k_tokens"].get<double>() == Approx(7));
  CHECK(m["fast_1_at_rollouts"].get<double>() == Approx(1 - std::pow(0.8, 4)));
  CHECK(m["fast_1_at_tokens"].get<double>() == Approx(1 - std::pow(0.8, 7)));
  // Between whole k: linear.
  runs[1].compute["student_tokens"] = 3 * 650;
  m = matched_budgets(runs[1], runs[0]);
  CHECK(m["fast_1_at_tokens"].get<double>() == Approx(((1 - std::pow(0.8, 6)) + (1 - std::pow(0.8, 7))) / 2));

  // Past the curve's end in tokens (1,000 a task: 10 samples of a curve of 8): refused, in either order, saying
  // what best-of-N needs.
  runs[1].compute["student_tokens"] = 3000;
  for (auto order : {runs, std::vector<ComparedRun>{runs[1], runs[0]}}) {
    auto d = budget_differences(order);
    REQUIRE(d.size() == 1);
    CHECK(d[0].find("rollouts and tokens: refine") == 0);
    CHECK(d[0].find("at least k = 10") != std::string::npos);
  }
  m = matched_budgets(runs[1], runs[0]);
  CHECK_FALSE(m["reaches"].get<bool>());
  CHECK(m["fast_1_at_tokens"].is_null());

  // Less than one sample's worth: refused as such, not as a curve too short.
  runs[1].compute["student_tokens"] = 3 * 50;
  auto below = budget_differences(runs);
  REQUIRE(below.size() == 1);
  CHECK(below[0].find("spends less than one sample a task of bon") != std::string::npos);

  // The run's own task count and the curve's tokens a sample: refinement over 2 tasks (4 rollouts and
  // 600 tokens a task) beside best-of-N over 3 (100 tokens a sample).
  runs[1] = compared("refine2", 2, 8, 1200, 1, true);
  m = matched_budgets(runs[1], runs[0]);
  CHECK(m["k_rollouts"].get<double>() == Approx(4));
  CHECK(m["k_tokens"].get<double>() == Approx(6));

  // Two runs of independent draws (or two multi-turn runs) still need equal rollouts.
  std::vector<ComparedRun> two = {compared("bon", 3, 24, 2400, 8, false), compared("bon16", 3, 48, 4800, 16, false)};
  auto d = budget_differences(two);
  REQUIRE(d.size() == 1);
  CHECK(d[0] == "rollouts: 24 in bon but 48 in bon16");
}

TEST_CASE("over seeds each arm is tested against best-of-N's curve at its own rollouts and tokens", "[analysis]") {
  std::vector<ComparedRun> runs;
  const double scores[] = {0.9, 0.8, 0.95};
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    runs.push_back(compared("bon/seed-" + std::to_string(seed), 3, 24, 2400, 8, false));
    runs.back().arm = "bon";
    runs.back().seed = seed;
    // Each seed's curve its own: fast_1@k = 1 - (0.8 + 0.05 (seed - 2))^k.
    for (auto& a : runs.back().analysis["at_k"])
      a["fast_1"] = 1 - std::pow(0.8 + 0.05 * (double(seed) - 2), a["k"].get<double>());
  }
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    runs.push_back(compared("refine/seed-" + std::to_string(seed), 3, 12, 2100, 1, true));
    runs.back().arm = "refine";
    runs.back().seed = seed;
    runs.back().score = scores[seed - 1];
  }
  Comparison c = compare_runs(runs);
  REQUIRE(c.seeded);
  CHECK(c.curve_of(runs[4]) == &runs[1]);  // the curve of the same seed
  std::map<std::string, nlohmann::json> tests;
  for (auto& t : c.seeds["tests"]) tests[t["against"].get<std::string>()] = t;
  REQUIRE(tests.count("bon's fast_1@k at equal tokens"));
  REQUIRE(tests.count("bon's fast_1@k at equal rollouts"));
  auto& tok = tests["bon's fast_1@k at equal tokens"];
  CHECK(tok["arm"] == "refine");
  CHECK(tok["paired_seeds"] == 3);
  // Each seed against its own seed's curve.
  auto curve_mean = [](double k) {
    return ((1 - std::pow(0.75, k)) + (1 - std::pow(0.8, k)) + (1 - std::pow(0.85, k))) / 3;
  };
  CHECK(tok["mean_difference"].get<double>() == Approx((0.9 + 0.8 + 0.95) / 3 - curve_mean(7)));
  CHECK(tests["bon's fast_1@k at equal rollouts"]["mean_difference"].get<double>() ==
        Approx((0.9 + 0.8 + 0.95) / 3 - curve_mean(4)));
  // A seed the curve's arm did not run is not read on another seed's curve.
  runs[2].seed = 7;
  Comparison c2 = compare_runs(runs);
  CHECK(c2.matched(runs[5]).is_null());
  CHECK_FALSE(c2.matched(runs[4]).is_null());
}

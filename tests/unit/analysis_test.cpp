// analysis/: the statistics that have closed forms elsewhere, against values computed with mpmath
// (30 digits; the expressions are in each case's comment). The rest of the analysis is checked
// against numpy in tests/e2e/test_analysis.py.
#include "analysis/analysis.hpp"

#include <catch2/catch.hpp>

#include <cmath>

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

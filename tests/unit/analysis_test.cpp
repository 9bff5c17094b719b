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

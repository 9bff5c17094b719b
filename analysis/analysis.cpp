#include "analysis/analysis.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace kernelrl {

double pass_at_k(uint64_t n, uint64_t c, uint64_t k) {
  if (k == 0 || k > n) return std::numeric_limits<double>::quiet_NaN();
  if (n - c < k) return 1.0;
  // C(n - c, k) / C(n, k) = prod_{i = n - c + 1}^{n} (1 - k / i)
  double fail = 1.0;
  for (uint64_t i = n - c + 1; i <= n; ++i) fail *= 1.0 - double(k) / double(i);
  return 1.0 - fail;
}

namespace {

std::vector<double> ranks(const std::vector<double>& x) {
  std::vector<size_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return x[a] < x[b]; });
  std::vector<double> r(x.size());
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j + 1 < idx.size() && x[idx[j + 1]] == x[idx[i]]) ++j;
    double avg = (double(i) + double(j)) / 2.0 + 1.0;  // 1-based average rank of the tie
    for (size_t k = i; k <= j; ++k) r[idx[k]] = avg;
    i = j + 1;
  }
  return r;
}

double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = x.size();
  if (n < 2) return std::numeric_limits<double>::quiet_NaN();
  double mx = std::accumulate(x.begin(), x.end(), 0.0) / double(n);
  double my = std::accumulate(y.begin(), y.end(), 0.0) / double(n);
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < n; ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  if (sxx == 0 || syy == 0) return std::numeric_limits<double>::quiet_NaN();
  return sxy / std::sqrt(sxx * syy);
}

nlohmann::json num(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

struct Counts {
  uint64_t n = 0, correct = 0, hacked = 0, unconfirmed = 0;
  std::vector<uint64_t> fast;  // per threshold
  double speedup_sum = 0, log_speedup_sum = 0, reward_sum = 0, best = 0;
};

void add(Counts& c, const AnalysisSample& s, const std::vector<double>& p) {
  if (!s.evaluated) return;  // no verdict: in no rate
  if (c.fast.empty()) c.fast.assign(p.size(), 0);
  ++c.n;
  c.reward_sum += s.reward;
  c.hacked += s.hacked ? 1 : 0;
  c.unconfirmed += s.unconfirmed ? 1 : 0;
  if (!s.correct) return;
  ++c.correct;
  c.speedup_sum += s.speedup;
  c.log_speedup_sum += std::log(std::max(s.speedup, 1e-12));
  c.best = std::max(c.best, s.speedup);
  for (size_t i = 0; i < p.size(); ++i)
    if (s.speedup > p[i]) ++c.fast[i];
}

std::string p_key(double p) { return fmt::format("fast_{:g}", p); }

nlohmann::json summary(const Counts& c, const std::vector<double>& p) {
  nlohmann::json j = {{"samples", c.n},
                      {"correct", c.correct},
                      {"correct_rate", c.n ? double(c.correct) / double(c.n) : 0.0},
                      {"hacked_share", c.n ? double(c.hacked) / double(c.n) : 0.0},
                      {"unconfirmed", c.unconfirmed},
                      {"mean_speedup", c.correct ? num(c.speedup_sum / double(c.correct)) : nullptr},
                      {"geomean_speedup", c.correct ? num(std::exp(c.log_speedup_sum / double(c.correct))) : nullptr},
                      {"mean_reward", c.n ? c.reward_sum / double(c.n) : 0.0}};
  for (size_t i = 0; i < p.size(); ++i)
    j[p_key(p[i])] = c.n ? double(c.fast.empty() ? 0 : c.fast[i]) / double(c.n) : 0.0;
  return j;
}

// Mean over tasks of pass_at_k(n_t, c_t, k) for tasks with n_t >= k.
double mean_at_k(const std::vector<std::pair<uint64_t, uint64_t>>& tasks, const std::vector<size_t>& pick, uint64_t k) {
  double sum = 0;
  size_t used = 0;
  for (size_t i : pick) {
    auto [n, c] = tasks[i];
    if (n < k) continue;
    sum += pass_at_k(n, c, k);
    ++used;
  }
  return used ? sum / double(used) : std::numeric_limits<double>::quiet_NaN();
}

double percentile(std::vector<double> xs, double q) {  // linear interpolation, as numpy's default
  xs.erase(std::remove_if(xs.begin(), xs.end(), [](double v) { return !std::isfinite(v); }), xs.end());
  if (xs.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(xs.begin(), xs.end());
  double pos = q * double(xs.size() - 1);
  size_t lo = size_t(std::floor(pos)), hi = std::min(xs.size() - 1, lo + 1);
  return xs[lo] + (xs[hi] - xs[lo]) * (pos - double(lo));
}

}  // namespace

double spearman(const std::vector<double>& x, const std::vector<double>& y) { return pearson(ranks(x), ranks(y)); }

double equivalent_k(const std::vector<std::pair<double, double>>& curve, double target) {
  for (size_t i = 0; i < curve.size(); ++i) {
    if (curve[i].second < target) continue;
    if (i == 0) return target < curve[0].second ? -std::numeric_limits<double>::infinity() : curve[0].first;
    auto [k0, v0] = curve[i - 1];
    auto [k1, v1] = curve[i];
    return v1 == v0 ? k1 : k0 + (target - v0) / (v1 - v0) * (k1 - k0);
  }
  return std::numeric_limits<double>::quiet_NaN();
}

std::map<std::string, Selection> select_group(const std::vector<AnalysisSample>& g, uint32_t m) {
  std::map<std::string, Selection> out;
  uint32_t K = 0;  // samples evaluated (all of them, unless a deployable run left some out)
  for (auto& s : g) K += s.evaluated ? 1 : 0;
  auto pick = [&](const std::string& name, const AnalysisSample* s, uint32_t evals) {
    Selection sel;
    sel.applicable = true;
    sel.evaluations = evals;
    if (s) {
      sel.correct = 1;
      sel.speedup = s->speedup;
      sel.fast_1 = s->speedup > 1.0 ? 1 : 0;
    }
    out[name] = sel;
  };
  std::vector<const AnalysisSample*> correct;
  for (auto& s : g)
    if (s.correct) correct.push_back(&s);
  auto fastest = [](const std::vector<const AnalysisSample*>& xs) {
    const AnalysisSample* best = nullptr;
    for (auto* x : xs)
      if (!best || x->speedup > best->speedup) best = x;
    return best;
  };
  pick("oracle", fastest(correct), K);
  Selection rc;
  rc.applicable = true;
  rc.evaluations = K;
  if (!correct.empty()) {
    rc.correct = 1;
    for (auto* x : correct) {
      rc.speedup += x->speedup / double(correct.size());
      rc.fast_1 += (x->speedup > 1.0 ? 1.0 : 0.0) / double(correct.size());
    }
  }
  out["random_correct"] = rc;
  bool tokens = true;
  for (auto& s : g) tokens = tokens && s.num_tokens > 0;
  if (!tokens) return out;
  // By surprisal: lowest mean logprob first (stable: earlier samples win ties).
  auto by_surprisal = [](std::vector<const AnalysisSample*> xs) {
    std::stable_sort(xs.begin(), xs.end(), [](auto* a, auto* b) { return a->logprob_mean < b->logprob_mean; });
    return xs;
  };
  auto sc = by_surprisal(correct);
  pick("surprisal", sc.empty() ? nullptr : sc.front(), K);
  const AnalysisSample* conf = nullptr;
  for (auto* x : correct)
    if (!conf || x->logprob_mean > conf->logprob_mean) conf = x;
  pick("confidence", conf, K);
  sc.resize(std::min<size_t>(sc.size(), m));
  pick("surprisal_top_m", fastest(sc), K);
  std::vector<double> means;
  for (auto& s : g) means.push_back(s.logprob_mean);
  auto order = surprisal_order(means);
  order.resize(std::min<size_t>(order.size(), m));
  std::vector<const AnalysisSample*> top_correct;
  bool known = true;  // every one of the top m was evaluated
  for (size_t i : order) {
    known = known && g[i].evaluated;
    if (g[i].correct) top_correct.push_back(&g[i]);
  }
  if (known) pick("deployable_top_m", fastest(top_correct), uint32_t(order.size()));
  return out;
}

double mean_logprob(const std::vector<float>& logprobs) {
  double sum = 0;
  for (float x : logprobs) sum += x;
  return logprobs.empty() ? 0.0 : sum / double(logprobs.size());
}

std::vector<size_t> surprisal_order(const std::vector<double>& means) {
  std::vector<size_t> idx(means.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return means[a] < means[b]; });
  return idx;
}

double incomplete_beta(double a, double b, double x) {
  if (!(a > 0 && b > 0) || !(x >= 0 && x <= 1)) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0 || x == 1) return x;
  // The continued fraction converges fast for x < (a + 1) / (a + b + 2); otherwise use the symmetry
  // I_x(a, b) = 1 - I_{1-x}(b, a).
  if (x > (a + 1) / (a + b + 2)) return 1 - incomplete_beta(b, a, 1 - x);
  const double front =
      std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x)) / a;
  // Lentz's method on 1 / (1 + d1 / (1 + d2 / (1 + ...))).
  const double tiny = 1e-300;
  double f = 1, c = 1, d = 0;
  for (int i = 0; i <= 400; ++i) {
    const int m = i / 2;
    double num;
    if (i == 0)
      num = 1;
    else if (i % 2 == 0)
      num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m));
    else
      num = -((a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1));
    d = 1 + num * d;
    d = std::abs(d) < tiny ? tiny : d;
    d = 1 / d;
    c = 1 + num / c;
    c = std::abs(c) < tiny ? tiny : c;
    const double cd = c * d;
    f *= cd;
    if (std::abs(1 - cd) < 1e-15) return front * (f - 1);
  }
  return front * (f - 1);
}

double student_t_p_value(double t, double df) {
  if (std::isnan(t) || !(df > 0)) return std::numeric_limits<double>::quiet_NaN();
  if (std::isinf(t)) return 0;
  return incomplete_beta(df / 2, 0.5, df / (df + t * t));  // P(|T| > |t|)
}

double spearman_p_value(double rho, size_t n, int covariates) {
  const double df = double(n) - 2 - covariates;
  if (!std::isfinite(rho) || df < 1) return std::numeric_limits<double>::quiet_NaN();
  if (std::abs(rho) >= 1) return 0;
  return student_t_p_value(rho * std::sqrt(df / (1 - rho * rho)), df);
}

SeedTests seed_tests(const std::vector<double>& a, const std::vector<double>& b) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto mean_var = [](const std::vector<double>& x) {
    double m = 0, v = 0;
    for (double y : x) m += y / double(x.size());
    for (double y : x) v += (y - m) * (y - m) / double(x.size() - 1);
    return std::make_pair(m, v);
  };
  // A t statistic whose standard error is 0: infinite when the means differ, 0 when they agree.
  auto t_of = [](double diff, double se) { return se > 0 ? diff / se : diff == 0 ? 0.0 : diff * INFINITY; };
  SeedTests r;
  std::vector<double> d;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d.push_back(a[i] - b[i]);
  r.n = d.size();
  r.paired_t = r.paired_p = r.welch_t = r.welch_df = r.welch_p = r.sign_flip_p = nan;
  r.mean_difference = d.empty() ? nan : 0;
  for (double x : d) r.mean_difference += x / double(d.size());
  if (d.size() >= 2) {
    auto [md, vd] = mean_var(d);
    r.paired_t = t_of(md, std::sqrt(vd / double(d.size())));
    r.paired_p = r.paired_t == 0 && vd == 0 ? 1.0 : student_t_p_value(r.paired_t, double(d.size() - 1));
    if (d.size() <= 20) {  // every sign pattern of the differences: how often is |mean| as large?
      const uint64_t patterns = uint64_t(1) << d.size();
      uint64_t extreme = 0;
      for (uint64_t m = 0; m < patterns; ++m) {
        double s = 0;
        for (size_t i = 0; i < d.size(); ++i) s += (m >> i & 1) ? -d[i] : d[i];
        if (std::abs(s) >= std::abs(md * double(d.size())) * (1 - 1e-12)) ++extreme;
      }
      r.sign_flip_p = double(extreme) / double(patterns);
    }
  }
  if (a.size() >= 2 && b.size() >= 2) {
    auto [ma, va] = mean_var(a);
    auto [mb, vb] = mean_var(b);
    const double qa = va / double(a.size()), qb = vb / double(b.size());
    r.welch_t = t_of(ma - mb, std::sqrt(qa + qb));
    r.welch_df =
        qa + qb > 0 ? (qa + qb) * (qa + qb) / (qa * qa / double(a.size() - 1) + qb * qb / double(b.size() - 1)) : nan;
    r.welch_p = qa + qb > 0 ? student_t_p_value(r.welch_t, r.welch_df) : (ma == mb ? 1.0 : 0.0);
  }
  return r;
}

double partial_spearman(const std::vector<double>& x, const std::vector<double>& y, const std::vector<double>& z) {
  auto rx = ranks(x), ry = ranks(y), rz = ranks(z);
  double xy = pearson(rx, ry), xz = pearson(rx, rz), yz = pearson(ry, rz);
  double d = std::sqrt((1 - xz * xz) * (1 - yz * yz));
  if (!std::isfinite(d) || d == 0) return std::numeric_limits<double>::quiet_NaN();
  return (xy - xz * yz) / d;
}

namespace {

// Multi-turn runs: each turn's figures, and the best so far over each episode's turns.
nlohmann::json turn_figures(const std::vector<AnalysisSample>& samples, const std::vector<double>& p) {
  std::map<std::string, const AnalysisSample*> by_id;
  bool any = false;
  for (auto& s : samples) {
    any = any || s.turn > 0;
    if (!s.sample_id.empty()) by_id[s.sample_id] = &s;
  }
  nlohmann::json out = nlohmann::json::array();
  if (!any) return out;
  struct Turn {
    Counts now, best;
    uint64_t format_errors = 0, after_format_error = 0, fixed = 0;
  };
  std::map<uint32_t, Turn> turns;
  for (auto& s : samples) {
    if (s.turn == 0 || !s.evaluated) continue;
    Turn& t = turns[s.turn];
    add(t.now, s, p);
    t.format_errors += s.format_error ? 1 : 0;
    // The episode so far: this sample and its ancestors (a bounded walk: ids are unique).
    AnalysisSample best = s;
    const AnalysisSample* at = &s;
    for (uint32_t hops = 0; hops < 1024 && !at->parent_id.empty(); ++hops) {
      auto it = by_id.find(at->parent_id);
      if (it == by_id.end()) break;
      const AnalysisSample* parent = it->second;
      if (at == &s) {
        t.after_format_error += parent->format_error ? 1 : 0;
        t.fixed += parent->format_error && !s.format_error ? 1 : 0;
      }
      if (parent->evaluated && parent->correct && (!best.correct || parent->speedup > best.speedup)) {
        best.correct = true;
        best.speedup = parent->speedup;
      }
      at = parent;
    }
    add(t.best, best, p);
  }
  for (auto& [turn, t] : turns) {
    auto j = summary(t.now, p);
    j["turn"] = turn;
    j["format_errors"] = t.format_errors;
    j["after_format_error"] = t.after_format_error;
    j["format_fixed"] = t.fixed;
    j["format_fixed_rate"] = t.after_format_error ? num(double(t.fixed) / double(t.after_format_error)) : nullptr;
    auto b = summary(t.best, p);
    j["best_so_far"] = {{"correct_rate", b["correct_rate"]}};
    for (double x : p) j["best_so_far"][p_key(x)] = b[p_key(x)];
    out.push_back(j);
  }
  return out;
}

// pass@k and fast_1@k over tasks (the "1.0" threshold, or the first one given), with bootstrap
// intervals over tasks.
nlohmann::json at_k_figures(const std::map<std::string, Counts>& by_task, const AnalysisOptions& o) {
  std::vector<std::pair<uint64_t, uint64_t>> pass, fast;
  size_t fi = 0;
  for (size_t i = 0; i < o.p.size(); ++i)
    if (o.p[i] == 1.0) fi = i;
  uint64_t min_n = std::numeric_limits<uint64_t>::max();
  for (auto& [id, c] : by_task) {
    pass.push_back({c.n, c.correct});
    fast.push_back({c.n, c.fast.empty() ? 0 : c.fast[fi]});
    min_n = std::min(min_n, c.n);
  }
  std::vector<uint32_t> ks = o.ks;
  if (ks.empty() && !by_task.empty())
    for (uint64_t k = 1; k <= min_n; k *= 2) ks.push_back(uint32_t(k));
  std::vector<size_t> everyone(pass.size());
  std::iota(everyone.begin(), everyone.end(), 0);
  std::mt19937_64 rng(o.seed);
  std::vector<std::vector<size_t>> resamples(o.bootstrap, std::vector<size_t>(pass.size()));
  for (auto& r : resamples)
    for (auto& i : r) i = size_t(rng() % pass.size());
  const double lo_q = (1 - o.confidence) / 2, hi_q = 1 - lo_q;
  nlohmann::json at_k = nlohmann::json::array();
  for (uint32_t k : ks) {
    nlohmann::json j = {{"k", k}};
    size_t used = 0;
    for (auto& [n, c] : pass) used += n >= k ? 1 : 0;
    j["tasks"] = used;
    const std::string fast_name = p_key(o.p.empty() ? 1.0 : o.p[fi]);  // fast_1: correct and faster
    for (auto& [name, data] : std::vector<std::pair<std::string, const std::vector<std::pair<uint64_t, uint64_t>>*>>{
             {"pass", &pass}, {fast_name, &fast}}) {
      j[name] = num(mean_at_k(*data, everyone, k));
      if (o.bootstrap > 0 && !pass.empty()) {
        std::vector<double> boots;
        boots.reserve(resamples.size());
        for (auto& r : resamples) boots.push_back(mean_at_k(*data, r, k));
        j[name + "_ci"] = {num(percentile(boots, lo_q)), num(percentile(boots, hi_q))};
      }
    }
    at_k.push_back(j);
  }
  return at_k;
}

// Mean logprob against speedup, over correct samples with tokens: rank correlations and the
// surprisal quartiles.
nlohmann::json logprob_figures(const std::vector<AnalysisSample>& samples) {
  std::vector<double> lp, sp, len;
  for (auto& s : samples)
    if (s.correct && s.num_tokens > 0) {
      lp.push_back(s.logprob_mean);
      sp.push_back(s.speedup);
      len.push_back(double(s.num_tokens));
    }
  nlohmann::json lj = {{"n", lp.size()}};
  const double rho = spearman(lp, sp), prho = partial_spearman(lp, sp, len), lrho = spearman(len, sp);
  lj["spearman_rho"] = num(rho);
  lj["spearman_p"] = num(spearman_p_value(rho, lp.size()));
  lj["partial_spearman_rho_length"] = num(prho);
  lj["partial_spearman_p_length"] = num(spearman_p_value(prho, lp.size(), 1));
  lj["length_vs_speedup"] = {{"spearman_rho", num(lrho)}, {"spearman_p", num(spearman_p_value(lrho, lp.size()))}};
  // Quartiles of surprisal (-mean logprob), as the seeds number them: Q1 the most surprising
  // quarter (lowest mean logprob), Q4 the most confident.
  nlohmann::json quart = nlohmann::json::array();
  if (lp.size() >= 4) {
    std::vector<size_t> idx = surprisal_order(lp);
    for (int q = 0; q < 4; ++q) {
      size_t b = idx.size() * q / 4, e = idx.size() * (q + 1) / 4;
      double ssum = 0, lsum = 0, tsum = 0;
      uint64_t faster = 0;
      for (size_t i = b; i < e; ++i) {
        ssum += sp[idx[i]];
        lsum += lp[idx[i]];
        tsum += len[idx[i]];
        faster += sp[idx[i]] > 1.0 ? 1 : 0;
      }
      double n = double(e - b);
      quart.push_back({{"quartile", q + 1},
                       {"n", e - b},
                       {"mean_logprob", lsum / n},
                       {"mean_tokens", tsum / n},
                       {"mean_speedup", ssum / n},
                       {"faster_share", double(faster) / n}});
    }
  }
  lj["surprisal_quartiles"] = quart;
  return lj;
}

// Selection strategies over each (step, task) group of at least two samples.
nlohmann::json selection_figures(const std::vector<AnalysisSample>& samples, const AnalysisOptions& o) {
  std::map<std::pair<uint32_t, std::string>, std::vector<AnalysisSample>> groups;
  for (auto& s : samples) groups[{s.step, s.task_id}].push_back(s);
  std::map<std::string, std::pair<Selection, uint64_t>> totals;  // summed over groups, and the count
  uint64_t n_groups = 0;
  for (auto& [key, g] : groups) {
    if (g.size() < 2) continue;
    ++n_groups;
    for (auto& [name, sel] : select_group(g, o.m)) {
      if (!sel.applicable) continue;
      auto& t = totals[name];
      t.first.fast_1 += sel.fast_1;
      t.first.correct += sel.correct;
      t.first.speedup += sel.speedup;
      t.first.evaluations += sel.evaluations;
      ++t.second;
    }
  }
  nlohmann::json sel = {{"groups", n_groups}, {"m", o.m}, {"strategies", nlohmann::json::object()}};
  for (auto& [name, t] : totals) {
    double n = double(t.second);
    sel["strategies"][name] = {{"groups", t.second},
                               {"fast_1", t.first.fast_1 / n},
                               {"correct", t.first.correct / n},
                               {"mean_speedup", t.first.speedup / n},
                               {"evaluations_per_group", double(t.first.evaluations) / n}};
  }
  return sel;
}

}  // namespace

nlohmann::json analyze(const std::vector<AnalysisSample>& all_samples, const AnalysisOptions& o,
                       const std::map<uint32_t, std::map<std::string, double>>& learner) {
  std::vector<AnalysisSample> samples, held_out;
  for (auto& s : all_samples) (s.split.empty() ? samples : held_out).push_back(s);
  nlohmann::json out, held;
  if (!held_out.empty()) {
    for (auto& s : held_out) s.split.clear();
    held = analyze(held_out, o);
  }
  Counts all;
  std::map<uint32_t, Counts> by_step;
  std::map<std::string, Counts> by_task;
  std::map<std::pair<uint32_t, std::string>, Counts> by_step_task;
  for (auto& s : samples) {
    add(by_step_task[{s.step, s.task_id}], s, o.p);
    add(all, s, o.p);
    add(by_step[s.step], s, o.p);
    add(by_task[s.task_id], s, o.p);
  }
  out = summary(all, o.p);
  out["tasks"] = by_task.size();
  out["thresholds"] = o.p;
  nlohmann::json steps = nlohmann::json::array();
  for (auto& [step, c] : by_step) {
    auto j = summary(c, o.p);
    j["step"] = step;
    auto it = learner.find(step);
    if (it != learner.end()) j["learner"] = it->second;
    steps.push_back(j);
  }
  out["steps"] = steps;
  nlohmann::json tasks = nlohmann::json::array();
  for (auto& [id, c] : by_task) {
    auto j = summary(c, o.p);
    j["task_id"] = id;
    j["best_speedup"] = c.correct ? num(c.best) : nullptr;
    tasks.push_back(j);
  }
  out["per_task"] = tasks;
  nlohmann::json step_tasks = nlohmann::json::array();  // TTT trajectories: each task's figures per step
  for (auto& [key, c] : by_step_task) {
    auto j = summary(c, o.p);
    j["step"] = key.first;
    j["task_id"] = key.second;
    step_tasks.push_back(j);
  }
  out["per_step_task"] = step_tasks;

  out["at_k"] = at_k_figures(by_task, o);
  out["bootstrap"] = {{"resamples", o.bootstrap}, {"confidence", o.confidence}, {"seed", o.seed}, {"unit", "task"}};
  out["logprob_vs_speedup"] = logprob_figures(samples);
  out["selection"] = selection_figures(samples, o);
  if (auto turns = turn_figures(samples, o.p); !turns.empty()) out["turns"] = turns;
  if (!held.is_null()) out["eval"] = held;
  return out;
}

}  // namespace kernelrl

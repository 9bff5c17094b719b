#include "analysis/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

namespace kernelrl {

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

// Twenty colours; past them a series differs by its stroke (dashed, then dotted) and its hollow
// points, so that forty series stay apart and sixty still can be told by their legend.
const char* const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
                               "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#ff9896", "#98df8a", "#ffbb78",
                               "#c5b0d5", "#c49c94", "#f7b6d2", "#393b79", "#637939", "#8c6d31"};
constexpr size_t palette_size = sizeof(palette) / sizeof(palette[0]);
const char* color(size_t i) { return palette[i % palette_size]; }
const char* dash(size_t i) {
  static const char* const d[] = {"", " stroke-dasharray=\"5 3\"", " stroke-dasharray=\"1.5 2.5\""};
  return d[(i / palette_size) % 3];
}

double value(const nlohmann::json& j, const std::string& key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return std::numeric_limits<double>::quiet_NaN();
  return j[key].get<double>();
}

std::string fmt_num(double v, const char* spec = "{:.3f}") {
  return std::isfinite(v) ? fmt::format(fmt::runtime(spec), v) : std::string("-");
}

struct Series {
  std::string name;
  std::vector<double> x, y;
  std::vector<double> lo, hi;  // optional band, one per point
  bool line = true;            // join the points
};

struct Chart {
  std::string title, xlabel, ylabel;
  bool log2x = false, log2y = false;
  bool integer_x = false;  // x counts something (steps, turns): ticks at whole numbers only
  double ymin = std::numeric_limits<double>::quiet_NaN(), ymax = std::numeric_limits<double>::quiet_NaN();
  std::vector<Series> series;
};

// Round tick step for a range: 1, 2 or 5 times a power of ten.
double tick_step(double range, int want) {
  double raw = range / std::max(1, want);
  double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

std::string svg_chart(const Chart& c) {
  const double W = 680, H = 320, L = 64, R = 170, T = 16, B = 48;
  const double pw = W - L - R, ph = H - T - B;
  auto tx = [&](double x) { return c.log2x ? std::log2(x) : x; };
  auto ty = [&](double y) { return c.log2y ? std::log2(y) : y; };
  auto usable = [&](const Series& s, size_t i) {
    return std::isfinite(s.x[i]) && std::isfinite(s.y[i]) && !(c.log2x && s.x[i] <= 0) && !(c.log2y && s.y[i] <= 0);
  };
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (auto& s : c.series)
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!usable(s, i)) continue;
      x0 = std::min(x0, tx(s.x[i]));
      x1 = std::max(x1, tx(s.x[i]));
      y0 = std::min(y0, ty(s.y[i]));
      y1 = std::max(y1, ty(s.y[i]));
      if (i < s.lo.size() && std::isfinite(s.lo[i])) y0 = std::min(y0, s.lo[i]);
      if (i < s.hi.size() && std::isfinite(s.hi[i])) y1 = std::max(y1, s.hi[i]);
    }
  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "role=\"img\" aria-label=\"{}\">\n",
      W, H, W, H, esc(c.title));
  if (!std::isfinite(x0)) {
    o += fmt::format("<text x=\"{}\" y=\"{}\" class=\"empty\">no data</text>\n</svg>\n", L + 10, T + ph / 2);
    return o;
  }
  if (std::isfinite(c.ymin)) y0 = std::min(y0, ty(c.ymin));
  if (std::isfinite(c.ymax)) y1 = std::max(y1, ty(c.ymax));
  if (x1 - x0 < 1e-12) {
    x0 -= 1;
    x1 += 1;
  }
  if (y1 - y0 < 1e-12) {
    y0 -= 0.5;
    y1 += 0.5;
  }
  if (!c.series.empty() && !c.series.front().line) {  // scatter: keep edge points off the frame
    const double xp = (x1 - x0) * 0.03;
    x0 -= xp;
    x1 += xp;
  }
  const double pad = (y1 - y0) * 0.05;
  y1 += pad;
  if (!std::isfinite(c.ymin)) y0 -= pad;
  auto px = [&](double x) { return L + (tx(x) - x0) / (x1 - x0) * pw; };
  auto py_t = [&](double v) { return T + ph - (v - y0) / (y1 - y0) * ph; };  // v already on the axis' scale
  auto py = [&](double y) { return py_t(ty(y)); };
  // Axes and ticks (colours inline: the SVG reads the same inside the page and cut out of it).
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#ffffff\" stroke=\"#bbbbbb\"/>\n", L, T,
                   pw, ph);
  const double ys = c.log2y ? 1.0 : tick_step(y1 - y0, 5);
  for (double v = std::ceil(y0 / ys) * ys; v <= y1 + 1e-12; v += ys) {
    double label = c.log2y ? std::exp2(v) : (std::abs(v) < 1e-12 ? 0.0 : v);
    o += fmt::format(
        "<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#eeeeee\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"end\">{}</text>\n",
        L, L + pw, py_t(v), py_t(v), L - 6, py_t(v) + 4, esc(fmt::format("{:g}", label)));
  }
  if (c.log2x) {
    for (double e = std::ceil(x0); e <= x1 + 1e-12; e += 1)
      o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"middle\">{:g}</text>\n",
                       L + (e - x0) / (x1 - x0) * pw, T + ph + 16, std::exp2(e));
  } else {
    const double xs =
        c.integer_x ? std::max(1.0, std::ceil(tick_step(x1 - x0, 6))) : std::max(tick_step(x1 - x0, 6), 1e-12);
    for (double x = std::ceil(x0 / xs) * xs; x <= x1 + 1e-12; x += xs)
      o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"middle\">{:g}</text>\n", px(x),
                       T + ph + 16, std::abs(x) < 1e-12 ? 0.0 : x);
  }
  o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"label\" text-anchor=\"middle\">{}</text>\n", L + pw / 2,
                   H - 10, esc(c.xlabel));
  o += fmt::format(
      "<text transform=\"translate(14 {:.1f}) rotate(-90)\" class=\"label\" text-anchor=\"middle\">{}</text>\n",
      T + ph / 2, esc(c.ylabel));
  for (size_t si = 0; si < c.series.size(); ++si) {
    const auto& s = c.series[si];
    const char* col = color(si);
    std::vector<size_t> ok;
    for (size_t i = 0; i < s.x.size(); ++i)
      if (usable(s, i)) ok.push_back(i);
    // The interval band, then the line, then the points.
    if (!s.lo.empty() && ok.size() > 1) {
      std::string pts;
      for (size_t i : ok)
        pts += fmt::format("{:.1f},{:.1f} ", px(s.x[i]), py(std::isfinite(s.hi[i]) ? s.hi[i] : s.y[i]));
      for (auto it = ok.rbegin(); it != ok.rend(); ++it)
        pts += fmt::format("{:.1f},{:.1f} ", px(s.x[*it]), py(std::isfinite(s.lo[*it]) ? s.lo[*it] : s.y[*it]));
      o += fmt::format("<polygon points=\"{}\" fill=\"{}\" fill-opacity=\"0.15\" stroke=\"none\" data-band=\"{}\"/>\n",
                       pts, col, esc(s.name));
    }
    if (s.line && ok.size() > 1) {
      std::string pts;
      for (size_t i : ok) pts += fmt::format("{:.1f},{:.1f} ", px(s.x[i]), py(s.y[i]));
      o += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\"{}/>\n", pts, col,
                       dash(si));
    }
    const std::string marker = si < palette_size
                                   ? fmt::format("fill=\"{}\"", col)
                                   : fmt::format("fill=\"#ffffff\" stroke=\"{}\" stroke-width=\"1.5\"", col);
    for (size_t i : ok) {
      std::string band =
          i < s.lo.size() ? fmt::format(" data-lo=\"{:.17g}\" data-hi=\"{:.17g}\"", s.lo[i], s.hi[i]) : "";
      o += fmt::format(
          "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" {} data-chart=\"{}\" data-series=\"{}\" "
          "data-x=\"{:.17g}\" data-y=\"{:.17g}\"{}><title>{}: {:g}, {:.4g}</title></circle>\n",
          px(s.x[i]), py(s.y[i]), s.line ? 3 : 2.5, marker, esc(c.title), esc(s.name), s.x[i], s.y[i], band,
          esc(s.name), s.x[i], s.y[i]);
    }
    // Legend on the right: as many entries as its height holds, then how many more there are.
    const size_t rows = size_t((H - T - 10) / 16);
    const double ly = T + 10 + 16 * double(si);
    if (si + 1 < rows || c.series.size() <= rows) {
      o += fmt::format(
          "<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"3\"{}/>"
          "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"legend\">{}</text>\n",
          L + pw + 10, L + pw + 24, ly - 4, ly - 4, col, dash(si), L + pw + 27, ly,
          esc(s.name.size() > 24 ? s.name.substr(0, 23) + "…" : s.name));
    } else if (si + 1 == rows) {
      o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"legend\">+{} more (hover a point)</text>\n",
                       L + pw + 12, ly, c.series.size() - si);
    }
  }
  o += "</svg>\n";
  return o;
}

// Horizontal bars, one per (name, value), with a note after each.
std::string svg_bars(const std::string& series, const std::vector<std::tuple<std::string, double, std::string>>& bars,
                     const std::string& xlabel) {
  const double W = 760, row = 24, L = 150, R = 330, T = 10;
  const double H = T + row * double(bars.size()) + 36, pw = W - L - R;
  double hi = 0;
  for (auto& [n, v, note] : bars)
    if (std::isfinite(v)) hi = std::max(hi, v);
  if (hi <= 0) hi = 1;
  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "role=\"img\" aria-label=\"{}\">\n",
      W, H, W, H, esc(xlabel));
  for (size_t i = 0; i < bars.size(); ++i) {
    auto& [name, v, note] = bars[i];
    const double y = T + row * double(i);
    const double w = std::isfinite(v) ? v / hi * pw : 0;
    o += fmt::format("<text x=\"{}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"end\">{}</text>\n", L - 8, y + 15,
                     esc(name));
    o += fmt::format(
        "<rect x=\"{}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\" data-chart=\"selection\" "
        "data-series=\"{}\" "
        "data-x=\"{}\" data-y=\"{:.17g}\"><title>{}: {:.4g}</title></rect>\n",
        L, y + 3, w, row - 7, color(i), esc(series), esc(name), v, esc(name), v);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"tick\">{} {}</text>\n", L + w + 6, y + 15, fmt_num(v),
                     esc(note));
  }
  o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"label\" text-anchor=\"middle\">{}</text>\n", L + pw / 2,
                   H - 8, esc(xlabel));
  o += "</svg>\n";
  return o;
}

std::string table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows) {
  std::string o = "<table><tr>";
  for (auto& h : head) o += "<th>" + esc(h) + "</th>";
  o += "</tr>\n";
  for (auto& r : rows) {
    o += "<tr>";
    for (auto& x : r) o += "<td>" + esc(x) + "</td>";
    o += "</tr>\n";
  }
  return o + "</table>\n";
}

const char* const style =
    R"(body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:920px;color:#222}
h1{font-size:20px;word-break:break-all}h2{font-size:17px;margin-top:32px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}p.note{color:#555;max-width:760px}
svg text{font:11px system-ui,sans-serif;fill:#333}
svg .label{font-size:12px}svg .legend{font-size:11px}svg .empty{fill:#999}
)";

}  // namespace

std::string render_comparison_report(const std::string& title, const nlohmann::json& c) {
  std::string h =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>kernelrl comparison: " + esc(title) +
      "</title>\n<style>" + style + "</style></head><body>\n";
  h += "<h1>kernelrl comparison: " + esc(title) + "</h1>\n";
  auto name = [](const std::string& dir) {
    auto s = dir;
    while (!s.empty() && s.back() == '/') s.pop_back();
    auto p = s.rfind('/');
    return p == std::string::npos ? s : s.substr(p + 1);
  };
  // A run's label: its folder, or ARM/seed-S in a seeded comparison.
  auto label = [&](const nlohmann::json& r) {
    if (r.contains("seed") && r["seed"].is_number())
      return r.value("arm", std::string("?")) + "/seed-" + r["seed"].dump();
    return name(r.value("run_dir", std::string()));
  };
  std::vector<std::vector<std::string>> rows;
  const auto& runs = c.value("runs", nlohmann::json::array());
  for (auto& r : runs) {
    const auto& cp = r.value("compute", nlohmann::json::object());
    const auto& a = r.value("analysis", nlohmann::json::object());
    auto count = [&](const char* k) { return cp.contains(k) ? cp[k].dump() : std::string("-"); };
    auto secs = [&](const char* k) { return fmt_num(value(cp, k), "{:.1f}"); };
    std::string ek =
        r.contains("equivalent_k") && r["equivalent_k"].is_number() ? fmt_num(r["equivalent_k"].get<double>(), "{:.1f}")
        : r.contains("equivalent_k") && r["equivalent_k"].is_string() ? r["equivalent_k"].get<std::string>()
        : c.contains("curve_of") && !c["curve_of"].is_null()          ? "> K"
                                                                      : "-";
    rows.push_back({label(r), cp.contains("settings") ? cp["settings"].value("mode", std::string("?")) : "?",
                    count("rollouts"), count("evaluations"), count("student_tokens"), count("teacher_tokens"),
                    count("total_tokens"), secs("eval_seconds"), secs("learner_seconds"),
                    fmt_num(value(a, "correct_rate")), fmt_num(value(a, "fast_1")), fmt_num(value(r, "score")), ek});
  }
  h += "<h2>Arms</h2>\n" + table({"arm", "mode", "rollouts", "evaluations", "student tokens", "teacher tokens",
                                  "total tokens", "eval s", "learner s", "correct", "fast_1", "score", "equiv K"},
                                 rows);
  h +=
      "<p class=\"note\">score: fast_1, or the fast_1 of a ttt/sdpo/train arm's Best-of-Adaptation step. equiv K: the "
      "k "
      "at which the reference arm's fast_1@k curve reaches that score (linear between points; &gt; K: never within its "
      "samples; &lt; 1: below the curve's first point, what fewer than one sample a task would do).</p>\n";
  const auto& diffs = c.value("differences", nlohmann::json::array());
  if (!diffs.empty()) {
    h += "<h2>Budget differences (compared anyway)</h2>\n<ul>\n";
    for (auto& d : diffs) h += "<li>" + esc(d.get<std::string>()) + "</li>\n";
    h += "</ul>\n";
  }
  const nlohmann::json* ref = nullptr;
  for (auto& r : runs)
    if (c.contains("curve_of") && c["curve_of"].is_string() &&
        r.value("run_dir", std::string()) == c["curve_of"].get<std::string>())
      ref = &r;
  if (ref) {
    Chart ch{"comparison", "k (samples per task)", "fast_1"};
    ch.log2x = true;
    ch.ymin = 0;
    Series curve{label(*ref) + " fast_1@k"};
    double kmax = 1;
    for (auto& p : (*ref)["analysis"].value("at_k", nlohmann::json::array())) {
      curve.x.push_back(p["k"].get<double>());
      curve.y.push_back(value(p, "fast_1"));
      kmax = std::max(kmax, p["k"].get<double>());
    }
    ch.series.push_back(curve);
    for (auto& r : runs) {
      if (&r == ref) continue;
      Series s{label(r) + " score"};
      s.line = false;
      // At its equivalent K; at the curve's first k when below it ("< 1"), at its end when the
      // curve never reaches it.
      const double kmin = curve.x.empty() ? 1 : curve.x.front();
      s.x.push_back(r.contains("equivalent_k") && r["equivalent_k"].is_number()   ? r["equivalent_k"].get<double>()
                    : r.contains("equivalent_k") && r["equivalent_k"].is_string() ? kmin
                                                                                  : kmax);
      s.y.push_back(value(r, "score"));
      ch.series.push_back(s);
    }
    h += "<h2>Scores on the reference's scaling curve</h2>\n<p class=\"note\">The line is " + esc(label(*ref)) +
         "'s fast_1@k; each other arm's score sits at its equivalent K "
         "(at the curve's first k when below it, at its last k when it is never reached).</p>\n" +
         svg_chart(ch);
  }
  // Per task: best-of-N's fast_1@K against each task's Best-of-Adaptation.
  for (auto& pt : c.value("per_task_bon_vs_boa", nlohmann::json::array())) {
    std::vector<std::vector<std::string>> tr;
    for (auto& t : pt["tasks"])
      tr.push_back({t["task_id"].get<std::string>(), t["regime"].get<std::string>(),
                    fmt_num(value(t, "base_correct_rate")), fmt_num(value(t, "bon_fast_1_at_k")),
                    fmt_num(value(t, "boa_fast_1")), t["boa_step"].dump()});
    for (auto& [rg, g] : pt["regimes"].items())
      tr.push_back({"mean (" + std::to_string(g["tasks"].get<uint64_t>()) + " tasks)", rg, "",
                    fmt_num(value(g, "bon_fast_1_at_k")), fmt_num(value(g, "boa_fast_1")), ""});
    h += "<h2>Per task: " + esc(name(pt["bon_run_dir"].get<std::string>())) + "'s best-of-N against " +
         esc(name(pt["run_dir"].get<std::string>())) +
         "'s Best-of-Adaptation</h2>\n<p class=\"note\">BoN fast_1@K: some sample correct and faster; regime: "
         "covered when some base sample of the task is correct.</p>\n" +
         table({"task", "regime", "base correct", "BoN fast_1@K", "BoA fast_1", "BoA step"}, tr);
  }
  // Over seeds: mean and standard deviation of each arm, and each arm against the first.
  if (c.contains("seeds") && c["seeds"].is_object()) {
    const auto& sd = c["seeds"];
    std::vector<std::vector<std::string>> ar, tr;
    auto pm = [](const nlohmann::json& a, const std::string& k) {
      return fmt_num(value(a, k + "_mean")) + " ± " + fmt_num(value(a, k + "_std"));
    };
    for (auto& a : sd["arms"])
      ar.push_back(
          {a["arm"].get<std::string>(), a["seeds"].dump(), pm(a, "score"), pm(a, "fast_1"), pm(a, "correct_rate")});
    for (auto& t : sd["tests"])
      tr.push_back({t["arm"].get<std::string>() + " vs " + t["against"].get<std::string>(), t["paired_seeds"].dump(),
                    fmt_num(value(t, "mean_difference"), "{:+.3f}"), fmt_num(value(t, "paired_p"), "{:.3g}"),
                    fmt_num(value(t, "sign_flip_p"), "{:.3g}"), fmt_num(value(t, "welch_p"), "{:.3g}")});
    h += "<h2>Over seeds</h2>\n" + table({"arm", "seeds", "score", "fast_1", "correct"}, ar) +
         table({"test", "paired seeds", "score difference", "paired t p", "sign-flip p", "Welch p"}, tr);
  }
  h +=
      "<p class=\"note\">Made by <code>launch report</code> from comparison.json (<code>launch compare --json</code>); "
      "each arm has its own report: <code>launch report RUN_DIR/ARM</code>.</p>\n</body></html>\n";
  return h;
}

namespace {

// Each section of a run's report (render_report), in the page's order; "" when it has nothing to show.
const std::string fk = "fast_1";  // the headline rate's key

std::string summary_section(const ReportInputs& in, const nlohmann::json& a) {
  std::string h;
  // Summary figures.
  std::string mode = in.summary.is_object() && in.summary.contains("mode") ? in.summary["mode"].get<std::string>() : "";
  std::vector<std::vector<std::string>> rows = {
      {"mode", mode.empty() ? "-" : mode},
      {"samples", a.contains("samples") ? std::to_string(a["samples"].get<uint64_t>()) : "-"},
      {"tasks", a.contains("tasks") ? std::to_string(a["tasks"].get<uint64_t>()) : "-"},
      {"correct rate", fmt_num(value(a, "correct_rate"))}};
  if (a.contains("thresholds"))
    for (auto& p : a["thresholds"]) {
      std::string k = fmt::format("fast_{:g}", p.get<double>());
      rows.push_back({k, fmt_num(value(a, k))});
    }
  rows.push_back({"mean speedup (correct)", fmt_num(value(a, "mean_speedup"), "{:.3f}x")});
  rows.push_back({"geomean speedup (correct)", fmt_num(value(a, "geomean_speedup"), "{:.3f}x")});
  if (in.summary.is_object() && in.summary.contains("boa"))
    rows.push_back(
        {"best of adaptation", fmt::format("step {} (fast_1 {:.3f}){}", in.summary["boa"]["step"].get<uint32_t>(),
                                           in.summary["boa"]["fast_1"].get<double>(),
                                           in.summary.value("stopped_early", false) ? ", stopped early" : "")});
  if (a.contains("eval") && !a["eval"].value("steps", nlohmann::json::array()).empty()) {
    const auto& ev = a["eval"]["steps"];
    rows.push_back({"held-out " + fk,
                    fmt::format("{} at version {}, {} at version {}", fmt_num(value(ev.front(), fk)),
                                ev.front()["step"].dump(), fmt_num(value(ev.back(), fk)), ev.back()["step"].dump())});
  }
  h += "<h2>Summary</h2>\n" + table({"figure", "value"}, rows);
  if (in.compute.is_object()) {
    std::vector<std::vector<std::string>> cr;
    for (auto k : {"rollouts", "student_prompt_tokens", "student_completion_tokens", "student_tokens", "teacher_tokens",
                   "total_tokens"})
      if (in.compute.contains(k)) cr.push_back({k, fmt::format("{}", in.compute[k].dump())});
    for (auto k : {"eval_seconds", "eval_device_seconds", "compile_seconds", "learner_seconds"})
      if (in.compute.contains(k)) cr.push_back({k, fmt_num(in.compute[k].get<double>(), "{:.1f}")});
    if (in.compute.contains("settings"))
      for (auto& [k, v] : in.compute["settings"].items())
        cr.push_back({"settings." + k, v.is_string() ? v.get<std::string>() : v.dump()});
    h += "<h2>Compute (the budget)</h2>\n" + table({"figure", "value"}, cr);
  }
  return h;
}

std::string training_section(const nlohmann::json& a) {
  std::string h;
  // Training curves.
  const auto& steps = a.value("steps", nlohmann::json::array());
  if (steps.size() > 1) {
    Chart c{"training curves", "step", "rate / reward"};
    c.integer_x = true;
    Series f1{"fast_1"}, cr{"correct rate"}, rw{"mean reward"}, hk{"hacked share"};
    for (auto& s : steps) {
      double x = s["step"].get<double>();
      f1.x.push_back(x), f1.y.push_back(value(s, fk));
      cr.x.push_back(x), cr.y.push_back(value(s, "correct_rate"));
      rw.x.push_back(x), rw.y.push_back(value(s, "mean_reward"));
      hk.x.push_back(x), hk.y.push_back(value(s, "hacked_share"));
    }
    c.series = {f1, cr, rw, hk};
    std::string held_note;
    if (a.contains("eval")) {  // the periodic evaluation on held-out tasks, at the versions evaluated
      Series hf{"held-out fast_1"}, hc{"held-out correct rate"};
      for (auto& s : a["eval"].value("steps", nlohmann::json::array())) {
        double x = s["step"].get<double>();
        hf.x.push_back(x), hf.y.push_back(value(s, fk));
        hc.x.push_back(x), hc.y.push_back(value(s, "correct_rate"));
      }
      c.series.push_back(hf);
      c.series.push_back(hc);
      held_note =
          " The held-out series are the periodic evaluation on the eval tasks, drawn by the policy of each "
          "version evaluated (never learned from).";
    }
    c.ymin = 0;
    h += "<h2>Training curves</h2>\n<p class=\"note\">Each step's samples: fast_1 (correct and faster than the "
         "reference), correct rate, mean reward and the share caught gaming the harness (status hacked). A train run's "
         "steps are sampled by the policy of that version; a "
         "ttt/sdpo run's best step is its Best-of-Adaptation." +
         held_note + "</p>\n" + svg_chart(c);
    Chart l{"learner", "step", "value"};
    Series loss{"loss"}, ent{"entropy"}, kl{"kl"};
    for (auto& s : steps) {
      if (!s.contains("learner")) continue;
      double x = s["step"].get<double>();
      loss.x.push_back(x), loss.y.push_back(value(s["learner"], "loss"));
      ent.x.push_back(x), ent.y.push_back(value(s["learner"], "entropy"));
      kl.x.push_back(x), kl.y.push_back(value(s["learner"], "kl"));
    }
    if (!loss.x.empty()) {
      l.series = {loss, ent, kl};
      h += "<p class=\"note\">The learner's figures of the update made from each step's samples.</p>\n" + svg_chart(l);
    }
  }
  return h;
}

std::string turns_section(const nlohmann::json& a) {
  std::string h;
  // Multi-turn episodes: each turn's samples and the best so far over the turns.
  const auto& turns = a.value("turns", nlohmann::json::array());
  if (!turns.empty()) {
    Chart c{"turns", "turn", "rate"};
    c.integer_x = true;
    c.ymin = 0;
    Series f1{fk}, f12{"fast_1.2"}, bf1{"best so far " + fk}, bf12{"best so far fast_1.2"}, fe{"format errors"};
    std::vector<std::vector<std::string>> rows;
    for (auto& t : turns) {
      const double x = t["turn"].get<double>(), n = std::max(1.0, value(t, "samples"));
      f1.x.push_back(x), f1.y.push_back(value(t, fk));
      f12.x.push_back(x), f12.y.push_back(value(t, "fast_1.2"));
      bf1.x.push_back(x), bf1.y.push_back(value(t["best_so_far"], fk));
      bf12.x.push_back(x), bf12.y.push_back(value(t["best_so_far"], "fast_1.2"));
      fe.x.push_back(x), fe.y.push_back(value(t, "format_errors") / n);
      rows.push_back(
          {fmt::format("{}", t["turn"].get<uint32_t>()), fmt::format("{}", t["samples"].get<uint64_t>()),
           fmt::format("{:.3f}", value(t, "correct_rate")), fmt::format("{:.3f}", value(t, fk)),
           fmt::format("{:.3f}", value(t, "fast_1.2")), fmt::format("{:.3f}", value(t["best_so_far"], fk)),
           fmt::format("{:.3f}", value(t["best_so_far"], "fast_1.2")),
           fmt::format("{} / {}", t["format_fixed"].get<uint64_t>(), t["after_format_error"].get<uint64_t>())});
    }
    c.series = {f1, f12, bf1, bf12, fe};
    h +=
        "<h2>Turns</h2>\n<p class=\"note\">Multi-turn episodes: each turn's samples (the policy seeing its earlier "
        "attempts and the evaluator's feedback), and the best so far, each episode counted by the best of its turns up "
        "to that one (sequential test-time scaling). \"fixed\": samples after a format error that are none.</p>\n" +
        svg_chart(c) +
        table({"turn", "samples", "correct", fk, "fast_1.2", "best so far " + fk, "best so far fast_1.2", "fixed"},
              rows);
  }
  return h;
}

std::string scaling_section(const nlohmann::json& a) {
  std::string h;
  // Scaling curve.
  const auto& at_k = a.value("at_k", nlohmann::json::array());
  if (!at_k.empty()) {
    Chart c{"scaling curve", "k (samples per task)", "rate over tasks"};
    c.log2x = true;
    c.ymin = 0;
    Series pass{"pass@k"}, fast{fk + "@k"};
    for (auto& p : at_k) {
      double k = p["k"].get<double>();
      for (auto* s : {&pass, &fast}) {
        std::string key = s == &pass ? "pass" : fk;
        s->x.push_back(k);
        s->y.push_back(value(p, key));
        if (p.contains(key + "_ci")) {
          auto& ci = p[key + "_ci"];
          s->lo.push_back(ci[0].is_number() ? ci[0].get<double>() : NAN);
          s->hi.push_back(ci[1].is_number() ? ci[1].get<double>() : NAN);
        }
      }
    }
    for (auto* s : {&pass, &fast})
      if (s->lo.size() != s->x.size()) s->lo.clear(), s->hi.clear();
    c.series = {pass, fast};
    std::string conf =
        a.contains("bootstrap") ? fmt::format("{:g}%", 100 * a["bootstrap"].value("confidence", 0.95)) : "";
    h += "<h2>Scaling curve</h2>\n<p class=\"note\">The chance that at least one of k samples of a task is correct "
         "(pass@k) or correct and faster (" +
         fk + "@k), by the unbiased estimator, averaged over tasks; the bands are " + conf +
         " bootstrap intervals over tasks.</p>\n" + svg_chart(c);
  }
  return h;
}

std::string trajectories_section(const nlohmann::json& a) {
  std::string h;
  // TTT trajectories.
  const auto& pst = a.value("per_step_task", nlohmann::json::array());
  std::map<std::string, Series> traj;
  std::set<uint32_t> step_set;
  for (auto& r : pst) {
    auto& s = traj[r["task_id"].get<std::string>()];
    s.name = r["task_id"].get<std::string>();
    s.x.push_back(r["step"].get<double>());
    s.y.push_back(value(r, fk));
    step_set.insert(r["step"].get<uint32_t>());
  }
  // Only tasks seen at two steps or more have a trajectory (a train run samples a few tasks a step).
  size_t once = 0;
  Chart tc{"trajectories", "step", fk + " of the task's samples"};
  tc.ymin = 0;
  tc.integer_x = true;
  for (auto& [id, s] : traj) {
    if (s.x.size() >= 2)
      tc.series.push_back(s);
    else
      ++once;
  }
  if (step_set.size() > 1 && !tc.series.empty()) {
    h += "<h2>Per-task trajectories</h2>\n<p class=\"note\">Each task's " + fk +
         " step by step (test-time adaptation: "
         "how each task's samples improve as the adapter learns)" +
         (once ? fmt::format("; {} task{} sampled at one step only {} left out", once, once == 1 ? "" : "s",
                             once == 1 ? "is" : "are")
               : std::string()) +
         ".</p>\n" + svg_chart(tc);
  }
  return h;
}

std::string selection_section(const nlohmann::json& a) {
  std::string h;
  // Selection strategies.
  if (a.contains("selection") && a["selection"].contains("strategies") && !a["selection"]["strategies"].empty()) {
    const auto& sel = a["selection"];
    std::vector<std::tuple<std::string, double, std::string>> bars;
    for (auto name : {"oracle", "random_correct", "confidence", "surprisal", "surprisal_top_m", "deployable_top_m"}) {
      if (!sel["strategies"].contains(name)) continue;
      const auto& s = sel["strategies"][name];
      bars.push_back({name, value(s, "fast_1"),
                      fmt::format("({:g} evaluations/group, mean speedup {:.2f}x)", value(s, "evaluations_per_group"),
                                  value(s, "mean_speedup"))});
    }
    h += fmt::format(
             "<h2>Selection strategies</h2>\n<p class=\"note\">Over {} groups (a task's samples in one step), the "
             "chance that the strategy's pick is correct and faster than the reference; m = {}. Oracle needs every "
             "sample evaluated; deployable top-m ranks all samples by surprisal before evaluating any and "
             "evaluates only m.</p>\n",
             sel.value("groups", 0), sel.value("m", 0)) +
         svg_bars("selection fast_1", bars, "fast_1 of the selected sample");
  }
  return h;
}

std::string scatter_section(const ReportInputs& in, const nlohmann::json& a) {
  std::string h;
  // Per-task scatter: surprisal against speedup of correct samples.
  std::map<std::string, Series> by_task;
  for (auto& s : in.samples) {
    if (!s.correct || s.num_tokens == 0) continue;
    auto& x = by_task[s.task_id];
    x.name = s.task_id;
    x.line = false;
    x.x.push_back(-s.logprob_mean);
    x.y.push_back(s.speedup);
  }
  if (!by_task.empty()) {
    Chart c{"per-task scatter", "surprisal (minus the mean token logprob)", "speedup (log scale)"};
    c.log2y = true;
    for (auto& [id, s] : by_task) c.series.push_back(s);
    auto lv = a.value("logprob_vs_speedup", nlohmann::json::object());
    h += "<h2>Per-task scatter</h2>\n<p class=\"note\">Every correct sample, coloured by task: its surprisal against "
         "its speedup. Spearman's rho of mean logprob against speedup: " +
         fmt_num(value(lv, "spearman_rho")) + " (p " + fmt_num(value(lv, "spearman_p"), "{:.3g}") +
         "; partial on length: " + fmt_num(value(lv, "partial_spearman_rho_length")) + ", p " +
         fmt_num(value(lv, "partial_spearman_p_length"), "{:.3g}") + "); length against speedup: " +
         fmt_num(value(lv.value("length_vs_speedup", nlohmann::json::object()), "spearman_rho")) + " (p " +
         fmt_num(value(lv.value("length_vs_speedup", nlohmann::json::object()), "spearman_p"), "{:.3g}") + ").</p>\n" +
         svg_chart(c);
    std::vector<std::vector<std::string>> qr;
    for (auto& q : lv.value("surprisal_quartiles", nlohmann::json::array()))
      qr.push_back({"Q" + std::to_string(q["quartile"].get<int>()), std::to_string(q["n"].get<uint64_t>()),
                    fmt_num(value(q, "mean_logprob")), fmt_num(value(q, "mean_tokens"), "{:.0f}"),
                    fmt_num(value(q, "mean_speedup"), "{:.2f}x"), fmt_num(value(q, "faster_share"))});
    if (!qr.empty())
      h += "<p class=\"note\">Surprisal quartiles of the correct samples, Q1 the most surprising (lowest mean "
           "logprob).</p>\n" +
           table({"quartile", "samples", "mean logprob", "mean tokens", "mean speedup", "faster share"}, qr);
  }
  return h;
}

std::string tasks_section(const nlohmann::json& a) {
  std::string h;
  // Per-task table.
  std::vector<std::vector<std::string>> tr;
  for (auto& t : a.value("per_task", nlohmann::json::array()))
    tr.push_back({t["task_id"].get<std::string>(), std::to_string(t["samples"].get<uint64_t>()),
                  fmt_num(value(t, "correct_rate")), fmt_num(value(t, fk)),
                  fmt_num(value(t, "geomean_speedup"), "{:.2f}x"), fmt_num(value(t, "best_speedup"), "{:.2f}x")});
  if (!tr.empty()) h += "<h2>Tasks</h2>\n" + table({"task", "samples", "correct", fk, "geomean", "best"}, tr);
  return h;
}
}  // namespace

std::string render_report(const ReportInputs& in) {
  std::string h =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>kernelrl report: " + esc(in.title) +
      "</title>\n<style>" + style + "</style></head><body>\n";
  h += "<h1>kernelrl report: " + esc(in.title) + "</h1>\n";
  h += summary_section(in, in.analysis);
  h += training_section(in.analysis);
  h += turns_section(in.analysis);
  h += scaling_section(in.analysis);
  h += trajectories_section(in.analysis);
  h += selection_section(in.analysis);
  h += scatter_section(in, in.analysis);
  h += tasks_section(in.analysis);
  h += "<p class=\"note\">Made by <code>launch report</code> from the run's store; the figures are those of "
       "<code>launch analyze --json</code>.</p>\n</body></html>\n";
  return h;
}

}  // namespace kernelrl

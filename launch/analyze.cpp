// launch analyze RUN_DIR and launch report RUN_DIR: the analysis of a run's store, as tables, JSON or an HTML page.
#include "launch/cli.hpp"
#include "launch/commands.hpp"
#include "analysis/analysis.hpp"
#include "analysis/report.hpp"
#include "launch/json.hpp"
#include "launch/setup.hpp"
#include "store/store.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

namespace fs = std::filesystem;

namespace kernelrl {

namespace {

// analyze() over the run's store, with the learner's per-step figures.
nlohmann::json run_analysis(Store& store, const AnalyzeOptions& o, const std::vector<AnalysisSample>& samples) {
  std::map<uint32_t, std::map<std::string, double>> learner;
  for (auto& run : store.runs())
    for (auto& row : store.steps(run))
      if (!row.learner.empty()) learner[row.stats.step] = row.learner;
  AnalysisOptions ao;
  ao.p = o.p;
  ao.ks = o.ks;
  ao.bootstrap = o.bootstrap;
  ao.seed = o.seed;
  ao.m = o.m;
  return analyze(samples, ao, learner);
}

// Writes a report page and prints its path; 1 when it cannot be written.
int write_report(const std::string& out, const std::string& html) {
  std::ofstream f(out);
  f << html;
  f.close();
  if (!f) {
    std::fprintf(stderr, "launch report: cannot write %s\n", out.c_str());
    return 1;
  }
  std::printf("%s\n", fs::absolute(out).lexically_normal().string().c_str());
  return 0;
}

}  // namespace

int cmd_report(const AnalyzeOptions& o) {
  int rc = 0;
  // A comparison config's folder: its comparison.json, and the arms side by side.
  if (fs::is_directory(o.run_dir) && !fs::exists(fs::path(o.run_dir) / "store.sqlite") &&
      fs::exists(fs::path(o.run_dir) / "comparison.json")) {
    std::ifstream in(fs::path(o.run_dir) / "comparison.json");
    auto c = nlohmann::json::parse(in, nullptr, false);
    if (c.is_discarded() || !c.is_object()) {
      std::fprintf(stderr, "launch report: %s/comparison.json: not valid JSON\n", o.run_dir.c_str());
      return 2;
    }
    return write_report(o.out.empty() ? (fs::path(o.run_dir) / "report.html").string() : o.out,
                        render_comparison_report(fs::absolute(o.run_dir).lexically_normal().string(), c));
  }
  auto store = open_run_store("report", o.run_dir, rc);
  if (!store) return rc;
  ReportInputs in;
  in.samples = analysis_samples(*store);
  in.analysis = run_analysis(*store, o, in.samples);
  fs::path dir = fs::is_directory(o.run_dir) ? fs::path(o.run_dir) : fs::path(o.run_dir).parent_path();
  in.title = fs::absolute(dir).lexically_normal().string();
  auto runs = store->runs();
  if (!runs.empty()) {
    auto s = store->summary(runs.back());
    if (!s.empty()) in.summary = nlohmann::json::parse(s, nullptr, false);
  }
  std::ifstream cj(dir / "compute.json");
  if (cj) in.compute = nlohmann::json::parse(cj, nullptr, false);
  if (in.compute.is_discarded()) in.compute = nullptr;
  if (in.summary.is_discarded()) in.summary = nullptr;
  return write_report(o.out.empty() ? (dir / "report.html").string() : o.out, render_report(in));
}

int cmd_analyze(const AnalyzeOptions& o) {
  int rc = 0;
  auto store = open_run_store("analyze", o.run_dir, rc);
  if (!store) return rc;
  auto samples = analysis_samples(*store);
  bool learner = false;
  for (auto& run : store->runs())
    for (auto& row : store->steps(run)) learner = learner || !row.learner.empty();
  auto j = run_analysis(*store, o, samples);
  j["run_dir"] = fs::absolute(o.run_dir).lexically_normal().string();
  if (o.json) {
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  auto f = [](const nlohmann::json& v, const char* spec) {
    return v.is_number() ? fmt::format(fmt::runtime(spec), v.get<double>()) : std::string("-");
  };
  std::string fast_cols;
  for (double t : o.p) fast_cols += fmt::format(" {:>8}", fmt::format("fast_{:g}", t));
  auto fast_vals = [&](const nlohmann::json& x) {
    std::string s;
    for (double t : o.p) s += fmt::format(" {:>8}", f(x[fmt::format("fast_{:g}", t)], "{:.3f}"));
    return s;
  };
  std::string fast_line;
  for (double t : o.p) fast_line += fmt::format(", fast_{:g} {}", t, f(j[fmt::format("fast_{:g}", t)], "{:.3f}"));
  std::printf("%s: %llu samples over %llu tasks; correct %.3f%s; mean speedup %s, geomean %s (correct samples)\n",
              j["run_dir"].get<std::string>().c_str(), (unsigned long long)j["samples"].get<uint64_t>(),
              (unsigned long long)j["tasks"].get<uint64_t>(), j["correct_rate"].get<double>(), fast_line.c_str(),
              f(j["mean_speedup"], "{:.2f}x").c_str(), f(j["geomean_speedup"], "{:.2f}x").c_str());
  if (j.value("unconfirmed", uint64_t{0}) > 0)
    std::printf("%llu unconfirmed: correct, counted as not faster until `launch confirm` decides their speedups\n",
                (unsigned long long)j["unconfirmed"].get<uint64_t>());
  if (j["steps"].size() > 1 || learner) {
    std::printf("\n%5s %8s %8s%s %7s %11s %10s\n", "step", "samples", "correct", fast_cols.c_str(), "hacked",
                "mean reward", "loss");
    for (auto& st : j["steps"]) {
      std::string loss =
          st.contains("learner") && st["learner"].contains("loss") ? f(st["learner"]["loss"], "{:.4f}") : "-";
      std::printf("%5u %8llu %8.3f%s %7.3f %11.3f %10s\n", st["step"].get<uint32_t>(),
                  (unsigned long long)st["samples"].get<uint64_t>(), st["correct_rate"].get<double>(),
                  fast_vals(st).c_str(), st["hacked_share"].get<double>(), st["mean_reward"].get<double>(),
                  loss.c_str());
    }
  }
  if (j.contains("eval")) {  // a train run's periodic evaluation on held-out tasks
    auto& ev = j["eval"];
    std::printf("\nheld-out evaluation: %llu samples over %llu tasks\n%8s %8s %8s%s %9s\n",
                (unsigned long long)ev["samples"].get<uint64_t>(), (unsigned long long)ev["tasks"].get<uint64_t>(),
                "version", "samples", "correct", fast_cols.c_str(), "geomean");
    for (auto& st : ev["steps"])
      std::printf("%8u %8llu %8.3f%s %9s\n", st["step"].get<uint32_t>(),
                  (unsigned long long)st["samples"].get<uint64_t>(), st["correct_rate"].get<double>(),
                  fast_vals(st).c_str(), f(st["geomean_speedup"], "{:.2f}x").c_str());
  }
  if (j.contains("turns")) {  // multi-turn episodes: each turn, and the best so far over the turns
    std::string best_cols;
    for (double p : o.p) best_cols += fmt::format(" {:>11}", fmt::format("best f_{:g}", p));
    std::printf("\n%5s %8s %8s%s %9s %13s%s\n", "turn", "samples", "correct", fast_cols.c_str(), "format", "fixed",
                best_cols.c_str());
    for (auto& t : j["turns"]) {
      std::string best_vals;
      for (double p : o.p)
        best_vals += fmt::format(" {:>11.3f}", t["best_so_far"][fmt::format("fast_{:g}", p)].get<double>());
      std::printf(
          "%5u %8llu %8.3f%s %9llu %13s%s\n", t["turn"].get<uint32_t>(),
          (unsigned long long)t["samples"].get<uint64_t>(), t["correct_rate"].get<double>(), fast_vals(t).c_str(),
          (unsigned long long)t["format_errors"].get<uint64_t>(),
          fmt::format("{}/{}", t["format_fixed"].get<uint64_t>(), t["after_format_error"].get<uint64_t>()).c_str(),
          best_vals.c_str());
    }
  }
  std::printf("\n%-32s %8s %8s%s %9s %9s\n", "task", "samples", "correct", fast_cols.c_str(), "geomean", "best");
  for (auto& t : j["per_task"])
    std::printf("%-32s %8llu %8.3f%s %9s %9s\n", t["task_id"].get<std::string>().c_str(),
                (unsigned long long)t["samples"].get<uint64_t>(), t["correct_rate"].get<double>(), fast_vals(t).c_str(),
                f(t["geomean_speedup"], "{:.2f}x").c_str(), f(t["best_speedup"], "{:.2f}x").c_str());
  std::string fk = fmt::format(
      "fast_{:g}", o.p.empty() ? 1.0 : (std::find(o.p.begin(), o.p.end(), 1.0) != o.p.end() ? 1.0 : o.p[0]));
  std::printf("\n%5s %6s %8s %19s %8s %19s\n", "k", "tasks", "pass@k", "95% CI", (fk + "@k").c_str(), "95% CI");
  for (auto& a : j["at_k"]) {
    auto ci = [&](const char* key) {
      return a.contains(key) ? fmt::format("[{}, {}]", f(a[key][0], "{:.3f}"), f(a[key][1], "{:.3f}"))
                             : std::string("-");
    };
    std::printf("%5u %6llu %8s %19s %8s %19s\n", a["k"].get<uint32_t>(), (unsigned long long)a["tasks"].get<uint64_t>(),
                f(a["pass"], "{:.3f}").c_str(), ci("pass_ci").c_str(), f(a[fk], "{:.3f}").c_str(),
                ci((fk + "_ci").c_str()).c_str());
  }
  auto& lj = j["logprob_vs_speedup"];
  std::printf(
      "\nmean logprob vs speedup (%llu correct samples with tokens): Spearman rho %s (p %s), partial on length %s "
      "(p %s); length vs speedup: rho %s (p %s)\n",
      (unsigned long long)lj["n"].get<uint64_t>(), f(lj["spearman_rho"], "{:.3f}").c_str(),
      f(lj["spearman_p"], "{:.3g}").c_str(), f(lj["partial_spearman_rho_length"], "{:.3f}").c_str(),
      f(lj["partial_spearman_p_length"], "{:.3g}").c_str(),
      f(lj["length_vs_speedup"]["spearman_rho"], "{:.3f}").c_str(),
      f(lj["length_vs_speedup"]["spearman_p"], "{:.3g}").c_str());
  for (auto& q : lj["surprisal_quartiles"])
    std::printf(
        "  surprisal Q%d%s: %llu samples, mean logprob %.3f, mean tokens %.0f, mean speedup %.2fx, faster %.2f\n",
        q["quartile"].get<int>(), q["quartile"].get<int>() == 1 ? " (most surprising)" : "",
        (unsigned long long)q["n"].get<uint64_t>(), q["mean_logprob"].get<double>(), q["mean_tokens"].get<double>(),
        q["mean_speedup"].get<double>(), q["faster_share"].get<double>());
  auto& sel = j["selection"];
  if (sel["groups"].get<uint64_t>() > 0) {
    std::printf("\nselection over %llu groups (a task's samples in one step), m = %u:\n%-18s %7s %8s %13s %12s\n",
                (unsigned long long)sel["groups"].get<uint64_t>(), o.m, "strategy", "fast_1", "correct", "mean speedup",
                "evaluations");
    for (const char* name :
         {"oracle", "random_correct", "confidence", "surprisal", "surprisal_top_m", "deployable_top_m"}) {
      if (!sel["strategies"].contains(name)) continue;
      auto& x = sel["strategies"][name];
      std::printf("%-18s %7.3f %8.3f %12.2fx %12.1f\n", name, x["fast_1"].get<double>(), x["correct"].get<double>(),
                  x["mean_speedup"].get<double>(), x["evaluations_per_group"].get<double>());
    }
  }
  return 0;
}

void add_analyze(CLI::App& app, cli::Action& action) {
  for (const char* name : {"analyze", "report"}) {
    auto o = std::make_shared<AnalyzeOptions>();
    const bool report = std::string(name) == "report";
    auto* sub = cli::subcommand(
        app, name,
        report ? "launch report RUN_DIR [--out FILE] [--p ..] [--k ..] [--bootstrap N] [--seed S] [--m M]\n"
                 "  RUN_DIR/report.html (or FILE): the analysis with plots, readable offline"
               : "launch analyze RUN_DIR [--json] [--p 1.0,1.2] [--k 1,2,4] [--bootstrap N] [--seed S] [--m M]\n"
                 "  fast_p, pass@k / fast_1@k with bootstrap intervals, per step and task, selection strategies");
    sub->add_option("RUN_DIR", o->run_dir, "the run (or its store file)")->required()->type_name("");
    if (report)
      sub->add_option("--out", o->out, "the page (default: RUN_DIR/report.html)")->type_name("FILE");
    else
      sub->add_flag("--json", o->json, "one JSON object instead of tables");
    auto* p = sub->add_option("--p", o->p, "fast_p thresholds (default 1.0,1.2)")
                  ->delimiter(',')
                  ->check(cli::number("numbers like 1.0,1.2"))
                  ->type_name("1.0,1.2");
    sub->add_option("--k", o->ks, "the k of pass@k and fast_1@k (default 1, 2, 4, ... up to the samples per task)")
        ->delimiter(',')
        ->check(cli::count(1, 1 << 20, "counts like 1,2,4"))
        ->type_name("1,2,4");
    sub->add_option("--bootstrap", o->bootstrap, "bootstrap resamples of the intervals")->check(cli::count(0, 1000000));
    sub->add_option("--seed", o->seed, "the bootstrap's seed");
    sub->add_option("--m", o->m, "selection strategies' top-m")->check(cli::count(1, 1000000));
    sub->callback([&action, o, p, report] {
      if (p->count() == 0) o->p = {1.0, 1.2};
      action = [o, report] { return report ? cmd_report(*o) : cmd_analyze(*o); };
    });
  }
}

}  // namespace kernelrl

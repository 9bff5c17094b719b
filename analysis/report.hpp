// The run report (`launch report RUN_DIR`): one self-contained HTML page (inline CSS and SVG, no
// scripts, no external references: it opens offline) built from analyze()'s JSON. Plots: training
// curves (per-step fast_1, correct rate, reward; the learner's loss and entropy), the scaling
// curve (pass@k and fast_1@k with their bootstrap intervals), TTT trajectories (each task's fast_1
// per step), the selection strategies side by side, and a per-task scatter of correct samples
// (surprisal against speedup). Every plotted point carries its values as data-chart (the plot:
// "training curves", "learner", "scaling curve", "trajectories", "selection", "per-task scatter"),
// data-series, data-x and data-y attributes, so what is drawn can be checked against `launch analyze --json`.
#pragma once

#include "analysis/analysis.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace kernelrl {

struct ReportInputs {
  std::string title;                    // the run directory
  nlohmann::json analysis;              // analyze()'s output
  std::vector<AnalysisSample> samples;  // for the per-task scatter
  nlohmann::json summary;               // the run's summary (store), or null
  nlohmann::json compute;               // RUN_DIR/compute.json, or null
};

std::string render_report(const ReportInputs& in);

// The page of a comparison (a comparison config's RUN_DIR, from its comparison.json: `launch
// compare --json`): each arm's budget and figures side by side, and the reference run's fast_1@k
// curve with every arm's score placed at its equivalent K (data-chart "comparison").
std::string render_comparison_report(const std::string& title, const nlohmann::json& comparison);

}  // namespace kernelrl

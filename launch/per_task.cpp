// launch CONFIG with [experiment] per_task = true (ttt or sdpo): per-task adaptation as the seeds
// ran it. Each task gets a run of its own, `launch RUN_DIR/tasks/ID.toml --run-dir RUN_DIR/tasks/ID`
// (the config with [tasks] ids = [ID]): a fresh adapter from the same start ([policy] adapter or
// none), its own Best-of-Adaptation and early stopping. Then the runs are aggregated into RUN_DIR as
// one run: RUN_DIR/store.sqlite holds every task run's samples, steps and summary, plus a summary of
// its own ("per_task": true; "boa".fast_1 the mean over tasks of each task's Best-of-Adaptation
// fast_1; "per_task_boa" each task's), and RUN_DIR/compute.json the task runs' compute summed, with
// their settings and the whole task count, so that `launch analyze`, `report` and `compare` read
// RUN_DIR like any run. A task run that finished (has compute.json) is not run again: the same
// command with --run-dir RUN_DIR goes on after an interruption.
#include "wiring/child.hpp"
#include "launch/json.hpp"
#include "launch/commands.hpp"
#include "launch/setup.hpp"
#include "wiring/inputs.hpp"

#include "core/config.hpp"
#include "core/log.hpp"
#include "core/paths.hpp"
#include "store/store.hpp"

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace kernelrl {

namespace {

// The task run's config: the resolved config with [tasks] ids = [id], no split, per_task off.
std::string task_config(const Config& cfg, const std::string& id) {
  auto t = toml::parse(cfg.resolved_toml);
  auto* tasks = t["tasks"].as_table();
  tasks->insert_or_assign("ids", toml::array{id});
  tasks->erase("split");
  t["experiment"].as_table()->insert_or_assign("per_task", false);
  std::ostringstream out;
  out << t;
  return out.str();
}

// The task runs gathered into root's store and compute.json; false (with `err`) when one cannot be read.
bool aggregate(const Config& cfg, const std::string& root, const std::vector<std::string>& ids, std::string& err) {
  const fs::path store_path = fs::path(root) / cfg.store.file;
  for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(store_path.string() + suffix);  // made again whole
  auto store = Store::open(store_path.string(), cfg.store.synchronous, err);
  if (!store) return false;
  static const std::vector<std::string> summed = {
      "rollouts",       "evaluations",           "eval_split_rollouts",       "student_tokens",
      "teacher_tokens", "student_prompt_tokens", "student_completion_tokens", "total_tokens",
      "eval_seconds",   "eval_device_seconds",   "compile_seconds",           "learner_seconds"};
  nlohmann::json compute = nlohmann::json::object(), per = nlohmann::json::array();
  for (auto& k : summed) compute[k] = 0.0;
  double boa_sum = 0;
  uint64_t samples = 0;
  for (auto& id : ids) {
    const fs::path dir = fs::path(root) / "tasks" / id;
    auto cj = read_json_file((dir / "compute.json").string(), err);
    if (cj.is_null()) return false;
    for (auto& k : summed) compute[k] = compute[k].get<double>() + cj.value(k, 0.0);
    if (!compute.contains("settings")) compute["settings"] = cj.value("settings", nlohmann::json::object());
    auto child = Store::open_readonly((dir / cfg.store.file).string(), err);
    if (!child) return false;
    std::ifstream tin(fs::path(root) / "tasks" / (id + ".toml"));
    std::stringstream config;
    config << tin.rdbuf();
    nlohmann::json row = {{"task_id", id}, {"run_dir", dir.string()}};
    for (auto& run : child->runs()) {
      if (!store->begin_run(run, name(cfg.experiment.mode), config.str())) {
        err = store->last_error();
        return false;
      }
      for (auto& s : child->samples(run)) {
        if (store->record_sample(run, s.record) == InsertResult::failed) {
          err = store->last_error();
          return false;
        }
        ++samples;
      }
      auto steps = child->steps(run);
      for (auto& st : steps) store->record_step(run, st.stats, st.learner);
      const std::string summary = child->summary(run);
      store->finish_run(run, "completed", summary);
      auto sj = nlohmann::json::parse(summary, nullptr, false);
      row["steps"] = steps.size();
      if (sj.is_object() && sj.contains("boa")) {
        row["boa_step"] = sj["boa"].value("step", 0u);
        row["boa_fast_1"] = sj["boa"].value("fast_1", 0.0);
        row["checkpoint"] = sj["boa"].value("checkpoint", std::string());
      }
      if (sj.is_object()) row["stopped_early"] = sj.value("stopped_early", false);
    }
    if (!row.contains("boa_fast_1")) {
      err = dir.string() + ": the task's run has no Best-of-Adaptation step (did it learn?)";
      return false;
    }
    boa_sum += row["boa_fast_1"].get<double>();
    per.push_back(row);
  }
  const double mean = ids.empty() ? 0.0 : boa_sum / double(ids.size());
  nlohmann::json summary = {
      {"ok", true},          {"per_task", true},   {"mode", name(cfg.experiment.mode)},
      {"tasks", ids.size()}, {"samples", samples}, {"boa", {{"fast_1", mean}, {"per_task", true}}},
      {"per_task_boa", per}};
  const std::string run_id = fs::path(root).filename().string();
  if (!store->begin_run(run_id, name(cfg.experiment.mode), cfg.resolved_toml) ||
      !store->finish_run(run_id, "completed", summary.dump())) {
    err = store->last_error();
    return false;
  }
  compute["settings"]["tasks"] = std::to_string(ids.size());
  compute["settings"]["per_task"] = "true";
  for (auto& k : {"rollouts", "evaluations", "eval_split_rollouts", "student_tokens", "teacher_tokens",
                  "student_prompt_tokens", "student_completion_tokens", "total_tokens"})
    compute[k] = uint64_t(compute[k].get<double>());
  std::ofstream(fs::path(root) / "compute.json") << compute.dump(1) << "\n";
  std::printf("\n%-40s %6s %9s %10s %8s\n", "task", "steps", "BoA step", "BoA fast_1", "stopped");
  for (auto& r : per)
    std::printf("%-40s %6llu %9u %10.3f %8s\n", r["task_id"].get<std::string>().c_str(),
                (unsigned long long)r.value("steps", uint64_t{0}), r.value("boa_step", 0u), r.value("boa_fast_1", 0.0),
                r.value("stopped_early", false) ? "early" : "-");
  std::printf("per-task Best-of-Adaptation: mean fast_1 %.3f over %zu tasks; %llu rollouts\nrun directory: %s\n", mean,
              ids.size(), (unsigned long long)compute["rollouts"].get<uint64_t>(), root.c_str());
  std::fflush(stdout);
  return true;
}

}  // namespace

int cmd_run_per_task(const Config& cfg, const std::string& run_dir_arg, const std::string& log_level) {
  auto lg = log::get("launch");
  TaskSet tasks, eval_tasks;
  std::string err;
  if (!load_experiment_tasks(cfg, tasks, eval_tasks, err)) {
    lg->error("{}", err);
    return 2;
  }
  std::string root;
  std::error_code ec;
  try {
    root = run_dir_arg.empty() ? make_run_dir(cfg.experiment.run_root, cfg.experiment.name)
                               : fs::absolute(run_dir_arg).lexically_normal().string();
  } catch (const std::exception& e) {
    lg->error("[experiment] run_root {}: cannot make the run directory there: {}", cfg.experiment.run_root, e.what());
    return 2;
  }
  fs::create_directories(fs::path(root) / "tasks", ec);
  if (ec) {
    lg->error("{}: cannot create the run directory: {}", root, ec.message());
    return 2;
  }
  std::ofstream(fs::path(root) / "config.resolved.toml") << cfg.resolved_toml;
  std::vector<std::string> ids;
  for (auto& t : tasks.tasks()) ids.push_back(t.id);
  std::printf("per-task %s: %zu tasks, each from the same start, in %s\n", name(cfg.experiment.mode), ids.size(),
              root.c_str());
  std::fflush(stdout);
  const std::string exe = self_exe();
  for (size_t i = 0; i < ids.size(); ++i) {
    const fs::path dir = fs::path(root) / "tasks" / ids[i];
    if (fs::exists(dir / "compute.json")) {
      std::printf("task %zu/%zu %s: already done in %s\n", i + 1, ids.size(), ids[i].c_str(), dir.c_str());
      continue;
    }
    if (clear_unfinished(dir.string()))
      std::printf("task %zu/%zu %s: its unfinished run in %s starts again\n", i + 1, ids.size(), ids[i].c_str(),
                  dir.c_str());
    const std::string file = (fs::path(root) / "tasks" / (ids[i] + ".toml")).string();
    std::ofstream(file) << task_config(cfg, ids[i]);
    std::printf("task %zu/%zu %s: launch %s --run-dir %s\n", i + 1, ids.size(), ids[i].c_str(), file.c_str(),
                dir.c_str());
    std::fflush(stdout);
    std::vector<std::string> argv = {exe, file, "--run-dir", dir.string()};
    if (!log_level.empty()) argv.insert(argv.end(), {"--log-level", log_level});
    const int rc = run_child(argv);
    if (rc != 0) {
      lg->error(
          "task {} failed (exit {}); the tasks before it are kept; run the same command with --run-dir {} to go on",
          ids[i], rc, root);
      return rc < 0 ? 1 : rc;
    }
  }
  if (!aggregate(cfg, root, ids, err)) {
    lg->error("per-task run {}: cannot gather the task runs: {}", root, err);
    return 1;
  }
  return 0;
}

}  // namespace kernelrl

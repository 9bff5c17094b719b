// launch CONFIG [--run-dir DIR | --resume RUN_DIR]: read the config, assemble the run (its
// inputs, its directory, the policy and learner engines, the actors around the experiment), run
// it to its end and print its tables.
#include "core/auth.hpp"
#include "core/curve.hpp"
#include "core/files.hpp"
#include "core/log.hpp"
#include "core/paths.hpp"
#include "experiment/assemble.hpp"
#include "gpu/worker_client.hpp"
#include "launch/cli.hpp"
#include "launch/cluster.hpp"  // JoinOptions
#include "wiring/cluster.hpp"
#include "wiring/learning.hpp"
#include "wiring/run.hpp"
#include "wiring/samplers.hpp"
#include "launch/commands.hpp"
#include "wiring/child.hpp"
#include "launch/setup.hpp"
#include "core/machine.hpp"
#include "launch/stop_signals.hpp"
#include "learner/lora_learner.hpp"
#include "policy/sampler_backend.hpp"
#include "store/store.hpp"
#include "tasks/prompt.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace fs = std::filesystem;

namespace kernelrl {

namespace {

void print_summary(const nlohmann::json& j, const std::string& run_dir) {
  if (j.contains("steps") && !j["steps"].empty()) {  // train: one line per step
    std::printf("\n%5s %8s %7s %11s %8s %10s %9s %8s\n", "step", "samples", "fast_1", "mean reward", "version", "loss",
                "grad norm", "entropy");
    for (auto& st : j["steps"]) {
      auto l = st.value("learner", nlohmann::json::object());
      auto num = [&](const char* k, const char* f) {
        return l.contains(k) ? fmt::format(fmt::runtime(f), l[k].get<double>()) : std::string("-");
      };
      std::printf("%5u %8llu %7.3f %11.3f %8llu %10s %9s %8s\n", st["step"].get<uint32_t>(),
                  static_cast<unsigned long long>(st["samples"].get<uint64_t>()), st["fast_1"].get<double>(),
                  st["mean_reward"].get<double>(),
                  static_cast<unsigned long long>(st["policy_version"].get<uint64_t>()), num("loss", "{:.4f}").c_str(),
                  num("grad_norm", "{:.3f}").c_str(), num("entropy", "{:.3f}").c_str());
    }
    std::printf("policy version %llu; checkpoints in %s/checkpoints\n",
                static_cast<unsigned long long>(j.value("policy_version", uint64_t{0})), run_dir.c_str());
    if (j.contains("boa"))
      std::printf("best of adaptation: step %u (fast_1 %.3f), %s%s\n", j["boa"]["step"].get<uint32_t>(),
                  j["boa"]["fast_1"].get<double>(), j["boa"]["checkpoint"].get<std::string>().c_str(),
                  j.value("stopped_early", false) ? "; stopped early ([experiment] patience)" : "");
    if (j.contains("eval") && !j["eval"].empty()) {  // the held-out tasks, per evaluated version
      std::printf("\nheld-out evaluation (%zu tasks):\n%8s %8s %8s %7s %13s\n", j["eval_tasks"].size(), "version",
                  "samples", "correct", "fast_1", "mean speedup");
      for (auto& e : j["eval"])
        std::printf("%8llu %8llu %8.3f %7.3f %12.2fx\n",
                    static_cast<unsigned long long>(e["policy_version"].get<uint64_t>()),
                    static_cast<unsigned long long>(e["samples"].get<uint64_t>()), e["correct_rate"].get<double>(),
                    e["fast_1"].get<double>(), e["mean_speedup"].get<double>());
      if (j.contains("eval_best"))
        std::printf("best held-out: policy version %llu (fast_1 %.3f)%s\n",
                    static_cast<unsigned long long>(j["eval_best"]["policy_version"].get<uint64_t>()),
                    j["eval_best"]["fast_1"].get<double>(),
                    j["eval_best"].contains("checkpoint")
                        ? (", " + j["eval_best"]["checkpoint"].get<std::string>()).c_str()
                        : " (its checkpoint was not kept: raise [learner] keep_last)");
    }
  }
  std::printf("\n%-32s %8s %9s %7s %13s\n", "task", "samples", "correct", "fast_1", "mean speedup");
  for (auto& t : j["tasks"]) {
    std::string correct = fmt::format("{}/{}", t["correct"].get<uint64_t>(), t["samples"].get<uint64_t>());
    std::string sp = t["correct"].get<uint64_t>() ? fmt::format("{:.2f}x", t["mean_speedup"].get<double>()) : "-";
    std::printf("%-32s %8llu %9s %7.2f %13s\n", t["task_id"].get<std::string>().c_str(),
                static_cast<unsigned long long>(t["samples"].get<uint64_t>()), correct.c_str(),
                t["fast_1"].get<double>(), sp.c_str());
  }
  std::string correct = fmt::format("{}/{}", j["correct"].get<uint64_t>(), j["samples"].get<uint64_t>());
  std::string sp = j["correct"].get<uint64_t>() ? fmt::format("{:.2f}x", j["mean_speedup"].get<double>()) : "-";
  std::printf("%-32s %8llu %9s %7.2f %13s\n", "overall", static_cast<unsigned long long>(j["samples"].get<uint64_t>()),
              correct.c_str(), j["fast_1"].get<double>(), sp.c_str());
  std::string statuses;
  for (auto& [k, v] : j["status_counts"].items())
    statuses += (statuses.empty() ? "" : ", ") + k + " " + std::to_string(v.get<uint64_t>());
  std::printf("statuses: %s\n", statuses.empty() ? "(none)" : statuses.c_str());
  std::printf("wall time: %.1f s\n", j["wall_s"].get<double>());
  std::printf("run directory: %s\n", run_dir.c_str());
  std::fflush(stdout);
}

// The newest complete checkpoint of RUN_DIR, or "".
std::string latest_checkpoint(const std::string& run_dir) {
  auto all = list_checkpoints((fs::path(run_dir) / "checkpoints").string());
  return all.empty() ? std::string() : all.back().second;
}

// Every leaf of a TOML table as KEY.PATH = value text ([[node]] entries as node[i].key).
void flatten(const toml::node& n, const std::string& key, std::map<std::string, std::string>& out) {
  if (auto* t = n.as_table()) {
    for (auto& [k, v] : *t) flatten(v, key.empty() ? std::string(k.str()) : key + "." + std::string(k.str()), out);
  } else if (auto* a = n.as_array(); a && a->is_array_of_tables()) {
    for (size_t i = 0; i < a->size(); ++i) flatten(*a->get(i), key + "[" + std::to_string(i) + "]", out);
  } else {
    std::ostringstream os;
    if (auto* arr = n.as_array())
      os << *arr;
    else
      n.visit([&](auto&& v) { os << v; });
    out[key] = os.str();
  }
}

// Why CONFIG may not continue the run in RUN_DIR ("": it may): a setting that shapes the
// experiment differs from the run's own (RUN_DIR/config.resolved.toml). What may change: the
// steps, logging and monitoring, where the roles run ([cluster], [[node]]) and activation
// checkpointing (the same gradients, recomputed).
std::string resume_conflicts(const Config& cfg, const std::string& run_dir) {
  const auto path = (fs::path(run_dir) / "config.resolved.toml").string();
  std::map<std::string, std::string> was, now;
  try {
    flatten(toml::parse_file(path), "", was);
    flatten(toml::parse(cfg.resolved_toml), "", now);
  } catch (const std::exception& e) {
    return path + ": cannot read the run's config: " + e.what();
  }
  auto may_change = [](const std::string& k) {
    for (const char* p : {"cluster.", "node[", "monitor."})
      if (k.rfind(p, 0) == 0) return true;
    // Where things are reached: the inference server, the interpreter, the build cache.
    for (const char* same :
         {"learner.steps", "learner.activation_checkpointing", "experiment.name", "experiment.run_root", "sampler.url",
          "sampler.urls", "sampler.devices", "learner.device", "learner.devices", "sampler.timeout_s",
          "sampler.max_retries", "sampler.api_key_env", "evaluator.python", "evaluator.cache_dir"})
      if (k == same) return true;
    return false;
  };
  std::vector<std::string> diffs;
  for (auto* side : {&was, &now})
    for (auto& [k, v] : *side) {
      if (may_change(k) || (side == &now && was.count(k))) continue;
      auto a = was.find(k), b = now.find(k);
      std::string before = a == was.end() ? "(unset)" : a->second, after = b == now.end() ? "(unset)" : b->second;
      if (before != after) diffs.push_back(fmt::format("{} ({} in the run, {} here)", k, before, after));
    }
  if (diffs.empty()) return "";
  std::string list;
  for (size_t i = 0; i < diffs.size() && i < 12; ++i) list += (i ? "; " : "") + diffs[i];
  if (diffs.size() > 12) list += fmt::format("; and {} more", diffs.size() - 12);
  return fmt::format(
      "{} differs from the run's config ({}) in what shapes the experiment: {}. Only [learner] steps, logging and "
      "monitoring, where roles run ([cluster], [[node]]) and where things are reached (the sampler's url, the "
      "evaluator's python and cache_dir) may change on resume",
      cfg.source_file, path, list);
}

}  // namespace

// Locks RUN_DIR for this process's lifetime (flock on RUN_DIR/.launch.lock, its pid written in it):
// "" or why not (another launch holds it).
static std::string lock_run_dir(const std::string& run_dir) {
  const auto path = (fs::path(run_dir) / ".launch.lock").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return path + ": cannot open the run directory's lock: " + std::strerror(errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char buf[64] = {};
    [[maybe_unused]] ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    std::string holder(buf);
    while (!holder.empty() && std::isspace(static_cast<unsigned char>(holder.back()))) holder.pop_back();
    return fmt::format(
        "{}: another launch is using this run directory (pid {}); wait for it to end, or give "
        "another --run-dir",
        run_dir, holder.empty() ? "unknown" : holder);
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {}  // the pid is only a hint
  return "";  // fd stays open (and locked) until the process ends
}

// "" or why a new run may not start in RUN_DIR: its store already holds a run of that name (its
// samples would be taken for the new run's, dropped as duplicates, and the run wait for them).
static std::string used_run_dir(const std::string& run_dir, const std::string& store_file) {
  const auto path = fs::path(run_dir) / store_file;
  if (!fs::exists(path)) return "";
  std::string err;
  auto store = Store::open_readonly(path.string(), err);
  if (!store) return "holds a store that cannot be read (" + err + "); give another --run-dir";
  const std::string run_id = fs::path(run_dir).filename().string();
  for (auto& id : store->runs())
    if (id == run_id)
      return fmt::format(
          "already holds run {} ({}); give another --run-dir, or `--resume {}` to continue a learning run", id,
          store->run_status(id), run_dir);
  return "";
}

std::optional<std::string> open_run_dir(const Config& cfg, const std::string& config_path, const std::string& arg,
                                        RunDirUse use) {
  auto lg = log::get("launch");
  const bool resume = use == RunDirUse::resume;
  const ModeTraits& mode = traits(cfg.experiment.mode);
  if (resume && !mode.learns) {
    lg->error("--resume {}: only train, ttt and sdpo runs resume ({} has [experiment] mode = \"{}\")", arg, config_path,
              mode.name);
    return std::nullopt;
  }
  // (A learner on another node keeps the checkpoints there: it checks them when it joins.)
  if (resume &&
      (!fs::exists(fs::path(arg) / cfg.store.file) || (latest_checkpoint(arg).empty() && !learner_node(cfg)))) {
    lg->error("--resume {}: not a train run directory (no {} or no checkpoints/step-N)", arg, cfg.store.file);
    return std::nullopt;
  }
  if (resume) {
    std::string why = resume_conflicts(cfg, arg);
    if (!why.empty()) {
      lg->error("--resume {}: {}", arg, why);
      return std::nullopt;
    }
  }
  std::string run_dir;
  std::error_code ec;
  if (arg.empty()) {
    try {
      run_dir = make_run_dir(cfg.experiment.run_root, cfg.experiment.name);
    } catch (const std::exception& e) {
      lg->error("[experiment] run_root {}: cannot make the run directory there: {}", cfg.experiment.run_root, e.what());
      return std::nullopt;
    }
  } else {
    const bool made = fs::create_directories(arg, ec);
    if (ec || !fs::is_directory(arg)) {
      lg->error("--run-dir {}: cannot create directory: {}", arg, ec ? ec.message() : "a file is in the way");
      return std::nullopt;
    }
    if (made)  // as make_run_dir: the owner's and the group's
      fs::permissions(arg, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec, ec);
    run_dir = fs::absolute(arg).lexically_normal().string();
  }
  fs::create_directories(fs::path(run_dir) / "workers", ec);
  if (ec) {
    lg->error("{}: cannot write in the run directory: {}", run_dir, ec.message());
    return std::nullopt;
  }
  if (std::string why = lock_run_dir(run_dir); !why.empty()) {
    lg->error("{}", why);
    return std::nullopt;
  }
  if (!resume) {
    std::string why = use == RunDirUse::fresh ? used_run_dir(run_dir, cfg.store.file) : "";
    if (!why.empty()) {
      lg->error("--run-dir {}: {}", run_dir, why);
      return std::nullopt;
    }
    std::ofstream out(fs::path(run_dir) / "config.resolved.toml");
    out << cfg.resolved_toml;
    if (!out.flush()) {
      lg->error("{}/config.resolved.toml: cannot write it", run_dir);
      return std::nullopt;
    }
  }
  log::add_run_file((fs::path(run_dir) / "launch.log").string());
  return run_dir;
}

namespace {

void log_start(const Config& cfg, const RunInputs& in, const std::string& run_id, const std::string& run_dir) {
  auto lg = log::get("launch");
  const ModeTraits& mode = traits(cfg.experiment.mode);
  if (cfg.sampler.backend == "replay")
    lg->info("run {} ({} mode, {} tasks, {} actions) in {}", run_id, mode.name, in.tasks.size(), in.records.size(),
             run_dir);
  else if (mode.learns)
    lg->info("run {} ({}: {} steps of {} tasks x {} samples from the {} sampler, {} tasks in all) in {}", run_id,
             mode.name, cfg.learner.steps, mode.adapts ? in.tasks.size() : cfg.learner.batch_size,
             cfg.learner.group_size, cfg.sampler.backend, in.tasks.size(), run_dir);
  else
    lg->info("run {} ({} mode, {} tasks, {} samples each from the {} sampler) in {}", run_id, mode.name,
             in.tasks.size(), std::max<uint32_t>(1, cfg.sampler.samples_per_task), cfg.sampler.backend, run_dir);
}

// Starts the experiment, waits for its summary, prints it; the exit code.
int run_to_end(caf::actor_system& sys, RunActors& run, const std::string& run_dir) {
  auto j = nlohmann::json::parse(run_to_summary(sys, run));
  if (j.contains("tasks") && j.value("samples", 0) > 0)
    print_summary(j, run_dir);
  else
    std::printf("run directory: %s\n", run_dir.c_str());
  if (j.value("ok", false)) return 0;
  if (j.value("interrupted", false)) return 1;  // said when it was asked for (cmd_run's StopSignals)
  log::get("launch")->error("run failed: {}", j.value("error", std::string("unknown error")));
  return 1;
}

}  // namespace

// [tracking]: tracking/tracker.py beside the run, following its store and telemetry (its output in
// RUN_DIR/tracking.log); its pid, or 0 with no tracker.
int start_tracker(const Config& cfg, const std::string& run_dir) {
  const auto& t = cfg.tracking;
  if (t.backend == "none") return 0;
  std::vector<std::string> argv = {t.python,    source_dir() + "/tracking/tracker.py",
                                   "--run-dir", run_dir,
                                   "--backend", t.backend,
                                   "--project", t.project,
                                   "--pid",     std::to_string(::getpid())};
  if (!t.name.empty()) argv.insert(argv.end(), {"--name", t.name});
  if (!t.dir.empty()) argv.insert(argv.end(), {"--dir", t.dir});
  const int pid = start_child(argv, (fs::path(run_dir) / "tracking.log").string());
  auto lg = log::get("launch");
  if (pid < 0)
    lg->warn("[tracking] {}: {} could not be started; the run goes on untracked", t.backend, t.python);
  else
    lg->info("[tracking] {}: tracking/tracker.py follows the run (its log: {}/tracking.log)", t.backend, run_dir);
  return pid;
}

int cmd_run(const std::string& config_path, const std::string& run_dir_arg, const std::string& log_level, bool resume) {
  auto cfg = load_with_level(config_path, log_level);
  if (!cfg) return 2;
  if (cfg->experiment.per_task) {
    if (resume) {
      log::get("launch")->error(
          "--resume: a per-task run goes on where it stopped with --run-dir DIR (finished tasks are kept)");
      return 2;
    }
    if (is_cluster(*cfg)) {
      log::get("launch")->error(
          "{}: [experiment] per_task runs one run per task from this process; a cluster's nodes would have to join "
          "each of them (run the tasks' configs one by one instead)",
          config_path);
      return 2;
    }
    return cmd_run_per_task(*cfg, run_dir_arg, log_level);
  }
  for (auto& n : cfg->nodes)  // this process's evaluators: the head's, or every node's in one process
    if ((!is_cluster(*cfg) || &n == &head_node(*cfg)) && !check_listed_gpus(*cfg, n)) return 2;
  auto lg = log::get("launch");
  if (std::string why = plan_step(*cfg, machine_memory_mb()).problem(); !why.empty()) {
    lg->error("{}: {}", config_path, why);
    return 2;
  }
  std::string secret;
  if (is_cluster(*cfg)) {
    std::string err;
    auto s = read_cluster_secret(cfg->cluster, err);
    if (!s) {
      lg->error("{}", err);
      return 2;
    }
    secret = *s;
  } else if (cfg->nodes.size() > 1) {
    lg->warn("no [[node]] has a port: the roles of all {} [[node]] entries run in this process", cfg->nodes.size());
  }
  auto in = read_inputs(*cfg);
  if (!in) return 2;
  auto run_dir = open_run_dir(*cfg, config_path, run_dir_arg, resume ? RunDirUse::resume : RunDirUse::fresh);
  if (!run_dir) return 2;
  if (resume && !learner_node(*cfg)) {  // a finished run: nothing to continue (said at any log level)
    auto all = list_checkpoints((fs::path(*run_dir) / "checkpoints").string());
    if (!all.empty() && all.back().first >= cfg->learner.steps) {
      std::printf(
          "%s: all %u steps are done (its newest checkpoint is %s); nothing to resume. To train on, raise the "
          "steps: --set learner.steps=N\n",
          run_dir->c_str(), cfg->learner.steps, all.back().second.c_str());
      return 0;
    }
  }
  const std::string run_id = fs::path(*run_dir).filename().string();
  log_start(*cfg, *in, run_id, *run_dir);
  // The engines are made before the actor system: a model that does not load is a clear error
  // here, not a dead actor later.
  std::vector<std::shared_ptr<SamplerBackend>> backends;
  std::shared_ptr<LearnerEngine> engine;
  try {
    // In a cluster the head runs samplers only with the sampler role; the others join from nodes.
    if (!is_cluster(*cfg) || has_role(head_node(*cfg), "sampler"))
      backends = make_backends(*cfg, *run_dir, head_node(*cfg), true);
    else
      lg->info("the head runs no sampler: the samplers of the nodes with the sampler role join it");
    if (traits(cfg->experiment.mode).learns) {
      if (const NodeConfig* ln = learner_node(*cfg))
        lg->info("the learner runs on node {}: it joins the head with `launch {} --node {}`", ln->name, config_path,
                 ln->name);
      else
        engine = make_engine(*cfg, *run_dir, resume);
    }
  } catch (const std::exception& e) {
    lg->error("{}", e.what());
    return 2;
  }
  caf::actor_system_config sys_cfg;
  add_message_types(sys_cfg);
  if (is_cluster(*cfg)) configure_middleman(sys_cfg, cfg->cluster);
  sys_cfg.set("logger.verbosity", caf::atom("quiet"));
  auto sys = std::make_unique<caf::actor_system>(sys_cfg);
  const int tracker = start_tracker(*cfg, *run_dir);
  int stopped_by = 0;
  const int code = [&] {
    auto run = spawn_run(*sys, *cfg, std::move(*in), *run_dir, run_id, resume, backends, std::move(engine), secret,
                         config_path);
    if (!run) return 2;
    // SIGINT or SIGTERM (Ctrl-C, a scheduler, systemd, `docker stop`): the run ends as an
    // interruption, its store and summary written; a second signal ends the process at once.
    const bool learns = traits(cfg->experiment.mode).learns;
    StopSignals stop([&, supervisor = run->supervisor](int sig) {
      const std::string why = fmt::format(
          "{} received: the run stops{}", signal_name(sig),
          learns ? fmt::format("; `launch {} --resume {}` continues it from its last checkpoint", config_path, *run_dir)
                 : fmt::format("; the samples recorded so far are kept in {}", *run_dir));
      lg->warn("{} (a second signal ends the process at once)", why);
      caf::anon_send(supervisor, interrupt_atom::value, why);
    });
    const int rc = run_to_end(*sys, *run, *run_dir);
    stopped_by = stop.caught();
    if (stopped_by) stop_all_workers();  // evaluations in flight end now; the run has ended
    return rc;
  }();
  const int exit_code = stopped_by ? 128 + stopped_by : code;  // as a shell reports a process a signal ended
  backends.clear();
  stop_actor_system(std::move(sys), std::chrono::seconds(10), exit_code);
  if (tracker > 0 && !finish_child(tracker, 120))
    lg->warn("the {} tracker did not finish within 120 s of the run's end; stopped (its log: {}/tracking.log)",
             cfg->tracking.backend, *run_dir);
  return exit_code;
}

}  // namespace kernelrl

namespace kernelrl {

namespace {

struct RunArgs {
  std::string config, run_dir, resume, node, log_level;
  std::vector<std::string> sets;  // --set KEY=VALUE
  bool join = false;
  JoinOptions join_options;
};

int run_command(const RunArgs& a) {
  const bool join_args = !a.join_options.name.empty() || a.join_options.cpu_slots || !a.join_options.gpus.empty();
  if (a.config.empty()) return cli::bad("", "missing CONFIG or subcommand");
  if (join_args && !a.join) return cli::bad("", "--name, --cpu-slots and --gpus go with --join");
  const bool resume = !a.resume.empty();
  const std::string& run_dir = resume ? a.resume : a.run_dir;
  if (a.join) {
    if (!a.node.empty())
      return cli::bad("", "--join adds a machine that is not in CONFIG; --node NAME starts one that is");
    if (!run_dir.empty()) return cli::bad("", "--join: a node keeps no run directory (the head does)");
    return cmd_join(a.config, a.join_options, a.log_level);
  }
  if (!a.node.empty()) {
    if (!run_dir.empty()) return cli::bad("", "--node: a node keeps no run directory (the head does)");
    return cmd_node(a.config, a.node, a.log_level);
  }
  if (is_comparison_config(a.config)) {
    if (resume)
      return cli::bad("",
                      "--resume: a comparison goes on where it stopped with --run-dir DIR (finished arms are kept)");
    return cmd_run_comparison(a.config, run_dir, a.log_level);
  }
  return cmd_run(a.config, run_dir, a.log_level, resume);
}

}  // namespace

void add_run(CLI::App& app, cli::Action& action) {
  auto a = std::make_shared<RunArgs>();
  app.add_option("CONFIG", a->config, "the experiment (or comparison, or cluster) to run")->type_name("");
  auto* run_dir = app.add_option("--run-dir", a->run_dir,
                                 "where the run keeps everything (default: a new folder "
                                 "under [experiment] run_root)")
                      ->type_name("DIR");
  app.add_option("--resume", a->resume, "continue this train run from its latest checkpoint")
      ->type_name("RUN_DIR")
      ->excludes(run_dir);
  app.add_option("--node", a->node, "run node NAME of the cluster CONFIG describes")->type_name("NAME");
  app.add_flag("--join", a->join, "add this machine (not in CONFIG) to CONFIG's cluster");
  app.add_option("--name", a->join_options.name, "--join: this node's name (default: the host name)")
      ->type_name("NAME");
  app.add_option("--cpu-slots", a->join_options.cpu_slots, "--join: CPU evaluators")->check(cli::count(1, 1024));
  app.add_option("--gpus", a->join_options.gpus, "--join: one evaluator per listed GPU")
      ->delimiter(',')
      ->check(cli::device_ids())
      ->type_name("0,1,...");
  app.add_option("--log-level", a->log_level, "trace, debug, info, warn, error, off (default: [cluster] log_level)")
      ->type_name("LEVEL");
  app.add_option("--set", a->sets,
                 "override a key of CONFIG, e.g. --set learner.learning_rate=2e-5 --set sampler.temperature=0.8 "
                 "(repeatable; the run keeps the effective config in RUN_DIR/config.resolved.toml)")
      ->type_name("KEY=VALUE");
  app.callback([&app, &action, a] {
    if (!app.get_subcommands().empty()) return;  // (a subcommand's own --set is its callback's)
    set_config_overrides(a->sets);
    action = [a] { return run_command(*a); };
  });
}

}  // namespace kernelrl

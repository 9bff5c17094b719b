// launch serve CONFIG [--host H] [--port P] [--run-dir DIR]: the evaluator as an HTTP/JSON service
// (actors/service.hpp). The config's evaluators (and, in a cluster, those of the nodes that join
// it with `launch CONFIG --node NAME`) behind the same dispatcher and reward as a run; every
// request's verdict kept in RUN_DIR/store.sqlite; SIGINT or SIGTERM ends it cleanly.
#include "launch/cli.hpp"
#include "wiring/cluster.hpp"
#include "launch/commands.hpp"
#include "launch/setup.hpp"
#include "wiring/inputs.hpp"

#include "actors/dispatcher.hpp"
#include "actors/evaluator.hpp"
#include "actors/gate.hpp"
#include "actors/reward.hpp"
#include "actors/service.hpp"
#include "core/auth.hpp"
#include "core/log.hpp"
#include "tasks/prompt.hpp"
#include "messages/messages.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <csignal>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <memory>

namespace fs = std::filesystem;

namespace kernelrl {

namespace {

struct ServeArgs {
  std::string config, host = "127.0.0.1", run_dir, log_level;
  int port = 8470;
  std::vector<std::string> sets;
  uint32_t max_pending = 1024;
  double max_body_mb = 4;
  double drain_s = 30;
};

// SIGINT and SIGTERM, and the HTTP front's end, wake the main thread through a pipe. (Handlers, not a
// blocked mask: the evaluators' workers and candidates are started by this process and must not
// inherit blocked signals; a caught signal's handler is reset to the default by exec.)
int wake_pipe[2] = {-1, -1};

void wake(char why) { [[maybe_unused]] ssize_t n = ::write(wake_pipe[1], &why, 1); }

void on_stop_signal(int sig) { wake(sig == SIGINT ? 'i' : 't'); }

// The next reason to wake: 'i' SIGINT, 't' SIGTERM, 'f' the front stopped; 0 after `timeout_ms` (-1: none).
char next_wake(int timeout_ms) {
  pollfd p{wake_pipe[0], POLLIN, 0};
  int r;
  while ((r = ::poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {}
  char c = 0;
  if (r > 0 && ::read(wake_pipe[0], &c, 1) != 1) c = 0;
  return c;
}

// The dispatcher's and the HTTP front's settings for the config's tasks.
void service_settings(const Config& cfg, const ServeArgs& a, const TaskSet& tasks, const TaskSet& eval_tasks,
                      DispatcherArgs& da, ServiceArgs& sa) {
  auto lg = log::get("serve");
  std::string err;
  for (auto* set : {&tasks, &eval_tasks})
    for (auto& t : set->tasks()) {
      da.task_paths[t.id] = sa.task_paths[t.id] = t.path;
      std::string user;  // the task as a prompt's user message, for clients that build datasets
      if (task_user_message(t, cfg.evaluator.action_space, cfg.tasks.languages, user, err))
        sa.task_prompts[t.id] = std::move(user);
      else
        lg->warn("task {}: no prompt for GET /v1/tasks: {}", t.id, err);
    }
  da.action_space = sa.action_space = cfg.evaluator.action_space;
  da.mode = sa.mode = cfg.evaluator.mode;
  da.seed = cfg.evaluator.seed;
  da.max_in_flight = cfg.evaluator.in_flight();
  da.max_attempts = cfg.evaluator.max_attempts;
  da.max_queue = std::max<uint32_t>(a.max_pending, 1);
}

// Serves until SIGINT, SIGTERM or the front's end (it should not end: then the service ends with
// an error instead of listening to nothing); on a signal, stops taking requests and gives those in
// flight up to --drain-s to be answered (a second signal ends the wait); records the summary.
// Returns the exit code.
int serve_until_stopped(caf::actor_system& sys, const ServeArgs& a, const service_front_actor& front,
                        const service_recorder_actor& recorder, std::vector<caf::actor>& all) {
  auto lg = log::get("serve");
  int code = 0;
  auto watcher = sys.spawn([front](caf::event_based_actor* self) -> caf::behavior {
    self->monitor(front);
    self->set_down_handler([](caf::down_msg&) { wake('f'); });
    return {[](tick_atom) {}};
  });
  all.push_back(watcher);
  char why = 0;
  while (!why) why = next_wake(-1);
  caf::scoped_actor self{sys};
  if (why == 'f') {
    lg->error("the HTTP front stopped; the service ends");
    code = 1;
  } else {
    lg->info("{}: stopping the service", why == 'i' ? "SIGINT" : "SIGTERM");
    anon_send(front, finish_atom::value);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(a.drain_s);
    while (std::chrono::steady_clock::now() < until) {
      double pending = 0;
      self->request(front, std::chrono::seconds(5), stats_atom::value)
          .receive([&](Telemetry& t) { pending = t.values["pending"]; }, [&](caf::error&) { pending = 0; });
      if (pending == 0) break;
      if (next_wake(250)) {
        lg->warn("a second signal: {} requests in flight are not answered", pending);
        break;
      }
    }
  }
  nlohmann::json summary = {{"ok", code == 0}, {"mode", "serve"}};
  self->request(front, std::chrono::seconds(5), stats_atom::value)
      .receive([&](Telemetry& t) { summary["service"] = t.values; }, [](caf::error&) {});
  self->request(recorder, std::chrono::seconds(10), finish_atom::value, summary.dump())
      .receive([](bool) {}, [](caf::error&) {});
  return code;
}

int cmd_serve(const ServeArgs& a) {
  if (::pipe2(wake_pipe, O_CLOEXEC) != 0) {
    std::perror("launch serve: pipe");
    return 1;
  }
  struct sigaction sa_stop {};
  sa_stop.sa_handler = on_stop_signal;
  sigemptyset(&sa_stop.sa_mask);
  sa_stop.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa_stop, nullptr);
  sigaction(SIGTERM, &sa_stop, nullptr);
  auto restore = [] {
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
  };

  auto cfg = load_with_level(a.config, a.log_level, /*render_prompts=*/false);  // (it renders no prompt)
  if (!cfg) return restore(), 2;
  auto lg = log::get("serve");
  if (is_comparison_config(a.config)) {
    lg->error("{}: a comparison config; serve one experiment's [tasks] and evaluators", a.config);
    return restore(), 2;
  }
  const bool cluster = is_cluster(*cfg);
  for (auto& n : cfg->nodes)
    if ((!cluster || &n == &head_node(*cfg)) && !check_listed_gpus(*cfg, n)) return restore(), 2;
  std::string secret;
  if (cluster) {
    std::string err;
    auto s = read_cluster_secret(cfg->cluster, err);
    if (!s) {
      lg->error("{}", err);
      return restore(), 2;
    }
    secret = *s;
  }
  TaskSet tasks, eval_tasks;
  std::string err;
  if (!load_experiment_tasks(*cfg, tasks, eval_tasks, err)) {
    lg->error("{}: {}", a.config, err);
    return restore(), 2;
  }
  auto run_dir = open_run_dir(*cfg, a.config, a.run_dir, RunDirUse::service);
  if (!run_dir) return restore(), 2;
  const std::string run_id = fs::path(*run_dir).filename().string();

  caf::actor_system_config sys_cfg;
  add_message_types(sys_cfg);
  if (cluster)
    configure_middleman(sys_cfg, cfg->cluster);
  else
    sys_cfg.load<caf::io::middleman>();
  sys_cfg.set("logger.verbosity", caf::atom("quiet"));
  auto sys = std::make_unique<caf::actor_system>(sys_cfg);
  int code = 0;
  {
    std::vector<caf::actor> all;  // stopped at the end
    uint64_t last_group = 0;
    auto recorder = spawn_service_recorder(*sys, (fs::path(*run_dir) / cfg->store.file).string(),
                                           cfg->store.synchronous, run_id, cfg->resolved_toml, last_group, err);
    if (!recorder) {
      lg->error("{}", err);
      code = 1;
    } else {
      all.push_back(caf::actor_cast<caf::actor>(recorder));
      auto reward = spawn_reward(*sys, cfg->reward, recorder);
      all.push_back(caf::actor_cast<caf::actor>(reward));
      DispatcherArgs da;
      ServiceArgs sa;
      service_settings(*cfg, a, tasks, eval_tasks, da, sa);
      auto dispatcher = spawn_dispatcher(*sys, da, reward);
      all.push_back(caf::actor_cast<caf::actor>(dispatcher));
      const std::string worker_logs = (fs::path(*run_dir) / "workers").string();
      for (auto& node : cfg->nodes) {
        if (cluster && &node != &head_node(*cfg)) continue;  // those join from their nodes
        for (auto& ea : node_evaluators(*cfg, node, worker_logs)) {
          all.push_back(
              caf::actor_cast<caf::actor>(spawn_evaluator(*sys, ea, caf::actor_cast<caf::actor>(dispatcher))));
          ++sa.local_evaluators;
        }
      }
      sa.host = a.host;
      sa.port = static_cast<uint16_t>(a.port);
      sa.run_id = run_id;
      sa.first_group = last_group;
      sa.max_pending = a.max_pending;
      sa.limits.max_body_bytes = static_cast<size_t>(a.max_body_mb * 1024 * 1024);
      auto service = spawn_service_front(*sys, sa, dispatcher, recorder, err);
      gate_actor gate;
      if (!service.front) {
        lg->error("{}", err);
        code = 1;
      } else {
        all.push_back(caf::actor_cast<caf::actor>(service.front));
        if (cluster) {
          const auto& head = head_node(*cfg);
          GateArgs ga;
          ga.cluster = cfg->cluster.name;
          ga.secret = secret;
          gate = spawn_gate(*sys, std::move(ga), dispatcher, service.front, monitor_actor{});
          all.push_back(caf::actor_cast<caf::actor>(gate));
          auto bound = publish_gate(gate, head.port, head.host);
          if (!bound) {
            lg->error("cannot listen on {}:{}: {}", head.host, head.port, sys->render(bound.error()));
            code = 1;
          } else {
            lg->info("cluster {}: evaluator nodes join with `launch {} --node NAME` (head at {}:{})", cfg->cluster.name,
                     a.config, head.host, *bound);
          }
        }
        if (code == 0) {
          std::printf("serving %zu tasks on http://%s:%u (POST /v1/evaluate; %u evaluators here; run directory %s)\n",
                      sa.task_paths.size(), a.host.c_str(), service.port, sa.local_evaluators, run_dir->c_str());
          std::fflush(stdout);
          code = serve_until_stopped(*sys, a, service.front, recorder, all);
          std::printf("stopped; every verdict is in %s/%s\n", run_dir->c_str(), cfg->store.file.c_str());
        }
      }
      if (gate) unpublish_gate(gate);
    }
    for (auto& x : all) anon_send_exit(x, caf::exit_reason::user_shutdown);
  }
  stop_actor_system(std::move(sys), std::chrono::seconds(10), code);
  restore();
  ::close(wake_pipe[0]);
  ::close(wake_pipe[1]);
  return code;
}

}  // namespace

void add_serve(CLI::App& app, cli::Action& action) {
  auto a = std::make_shared<ServeArgs>();
  auto* sub =
      cli::subcommand(app, "serve",
                      "launch serve CONFIG [--host H] [--port P] [--run-dir DIR]\n"
                      "  the evaluator as an HTTP/JSON service: POST /v1/evaluate {\"task\": ID, \"action\": TEXT}\n"
                      "  answers with the verdict record the store keeps (see docs/SERVE.md)");
  sub->add_option("CONFIG", a->config, "its [tasks], [evaluator], [reward] and [[node]] evaluators are served")
      ->required()
      ->type_name("");
  sub->add_option("--host", a->host, "the address to listen on (default 127.0.0.1; 0.0.0.0: every interface)")
      ->type_name("ADDR");
  sub->add_option("--port", a->port, "the port (default 8470; 0: any free port, printed)")
      ->check(CLI::Range(0, 65535))
      ->type_name("PORT");
  sub->add_option("--run-dir", a->run_dir, "where the verdicts are kept (default: a new folder under run_root)")
      ->type_name("DIR");
  sub->add_option("--max-pending", a->max_pending, "requests waiting for a verdict before 503 (default 1024)")
      ->check(cli::count(1, 1u << 20));
  sub->add_option("--max-body-mb", a->max_body_mb, "the largest request body accepted (default 4 MB; larger: 413)")
      ->check(CLI::Range(0.001, 1024.0))
      ->type_name("MB");
  sub->add_option("--drain-s", a->drain_s,
                  "on SIGINT/SIGTERM, how long requests in flight may take to be answered (default 30)")
      ->check(CLI::Range(0.0, 86400.0))
      ->type_name("S");
  sub->add_option("--log-level", a->log_level, "trace, debug, info, warn, error, off (default: info)")
      ->type_name("LEVEL");
  sub->add_option("--set", a->sets, "override a key of CONFIG (repeatable), as for `launch CONFIG`")
      ->type_name("KEY=VALUE");
  sub->callback([&action, a] {
    set_config_overrides(a->sets);
    if (a->log_level.empty()) a->log_level = "info";
    action = [a] { return cmd_serve(*a); };
  });
}

}  // namespace kernelrl

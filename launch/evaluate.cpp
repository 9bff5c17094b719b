// launch evaluate: one evaluator (compile stage + timing stage, as in a run) over candidate files,
// in order; one JSON object per candidate on stdout.
#include "launch/cli.hpp"
#include "launch/commands.hpp"
#include "launch/json.hpp"

#include <fmt/format.h>

#include "actors/evaluator.hpp"
#include "core/config.hpp"
#include "core/paths.hpp"
#include "core/log.hpp"
#include "core/machine.hpp"
#include "messages/messages.hpp"
#include "store/store.hpp"

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace kernelrl {

int cmd_evaluate(const EvaluateOptions& o) {
  struct Cand {
    std::string file, text, task_path, task_id;
  };
  std::vector<Cand> cands;
  for (auto& c : o.candidates) {
    std::error_code ec;
    if (!fs::is_regular_file(c.task, ec)) {
      std::fprintf(stderr, "launch evaluate: --task %s: no such file\n", c.task.c_str());
      return 2;
    }
    std::ifstream in(c.file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "launch evaluate: --candidate %s: cannot read the file\n", c.file.c_str());
      return 2;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    cands.push_back(
        {c.file, ss.str(), fs::absolute(c.task).lexically_normal().string(), fs::path(c.task).stem().string()});
  }
  if (cands.empty()) {
    std::fprintf(stderr, "launch evaluate: at least one --candidate FILE is needed\n");
    return 2;
  }
  EvaluatorConfig settings;
  if (!o.config.empty()) {
    auto res = load_config(o.config);
    if (auto* errs = std::get_if<std::vector<ConfigError>>(&res)) {
      for (auto& e : *errs) std::fprintf(stderr, "%s\n", e.format().c_str());
      return 2;
    }
    settings = std::get<Config>(res).evaluator;
  } else {
    settings.python = source_dir() + "/scripts/python";
  }
  if (!o.action.empty()) settings.action_space = o.action;
  if (!o.mode.empty()) settings.mode = o.mode;
  if (o.timeout_s > 0) settings.timeout_s = o.timeout_s;
  if (o.timing_precision >= 0) settings.timing_precision = o.timing_precision;
  if (o.reference_cache_mb >= 0) settings.reference_cache_mb = o.reference_cache_mb;
  if (o.compile_workers >= 0) settings.compile_workers = static_cast<uint32_t>(o.compile_workers);
  if (settings.action_space != "forward_body" && settings.action_space != "full_program") {
    std::fprintf(stderr, "launch evaluate: --action: expected forward_body or full_program, got \"%s\"\n",
                 settings.action_space.c_str());
    return 2;
  }
  if (settings.mode != "fast" && settings.mode != "full") {
    std::fprintf(stderr, "launch evaluate: --mode: expected fast or full, got \"%s\"\n", settings.mode.c_str());
    return 2;
  }
  if (o.device != "cpu" && o.device.rfind("cuda:", 0) != 0) {
    std::fprintf(stderr, "launch evaluate: --device: expected cpu or cuda:N, got \"%s\"\n", o.device.c_str());
    return 2;
  }
  log::set_level(o.log_level.empty() ? "warn" : o.log_level);

  caf::actor_system_config cfg;
  add_message_types(cfg);
  caf::actor_system sys{cfg};
  // per_device evaluators on the device (a worker process each): their candidates build, load and
  // check at once, each timed region alone (gpu/devlock.py); candidate i goes to evaluator i % n.
  const uint32_t n = std::max<uint32_t>(1, o.per_device);
  std::vector<evaluator_actor> evaluators;
  const auto memory_mb = plan_candidate_memory(settings, n, machine_memory_mb()).per_candidate_mb;
  for (uint32_t k = 0; k < n; ++k) {
    EvaluatorArgs ea;
    ea.id = "local/" + o.device + (k ? "#" + std::to_string(k + 1) : "");
    ea.settings = settings;
    ea.settings.memory_limit_mb = memory_mb;
    ea.worker.python = settings.python;
    ea.worker.script = source_dir() + "/gpu/worker.py";
    ea.worker.device = o.device;
    ea.worker.threads = settings.torch_threads;
    ea.worker.log_path = o.worker_log.empty() || k == 0 ? o.worker_log : o.worker_log + "." + std::to_string(k + 1);
    ea.worker.cache_dir = settings.cache_dir;
    ea.worker.isolate_network = settings.isolate_network;
    evaluators.push_back(spawn_evaluator(sys, ea, caf::actor{}));
  }

  caf::scoped_actor self{sys};
  // Everything is sent at once so the compile stage can build ahead; results print in order.
  std::vector<decltype(self->request(evaluators[0], caf::infinite, eval_atom::value, EvalRequest{}))> handles;
  for (size_t i = 0; i < cands.size(); ++i) {
    EvalRequest req;
    req.sample_id = cands[i].file;
    req.task_id = cands[i].task_id;
    req.task_path = cands[i].task_path;
    req.action = cands[i].text;
    req.action_space = settings.action_space;
    req.mode = settings.mode;
    req.seed = o.seed ? o.seed : settings.seed;
    handles.push_back(self->request(evaluators[i % n], caf::infinite, eval_atom::value, std::move(req)));
  }
  int rc = 0;
  for (size_t i = 0; i < handles.size(); ++i) {
    handles[i].receive(
        [&](EvalResult& r) {
          if (o.json) {
            std::printf("%s\n", result_json(r).dump().c_str());
          } else {
            // A candidate that was not timed (it failed before) has no times to print.
            const std::string times = r.runtime.trials > 0
                                          ? fmt::format("speedup {:7.3f}  {:.4f} ms (ref {:.4f} ms)", r.speedup,
                                                        r.runtime.median_ms, r.ref_runtime.median_ms)
                                          : std::string("not timed");
            std::printf("%-40s %-13s %s%s%s\n", r.sample_id.c_str(), to_string(r.status).c_str(), times.c_str(),
                        r.error.empty() ? "" : "  ", r.error.c_str());
          }
          std::fflush(stdout);
        },
        [&](caf::error& e) {
          std::fprintf(stderr, "launch evaluate: %s: %s\n", cands[i].file.c_str(), sys.render(e).c_str());
          rc = 1;
        });
  }
  for (auto& e : evaluators) self->send_exit(e, caf::exit_reason::user_shutdown);
  return rc;
}

void add_evaluate(CLI::App& app, cli::Action& action) {
  auto o = std::make_shared<EvaluateOptions>();
  auto tasks = std::make_shared<std::vector<std::string>>();
  auto files = std::make_shared<std::vector<std::string>>();
  auto* sub = cli::subcommand(
      app, "evaluate",
      "launch evaluate --task FILE --candidate FILE [--candidate FILE ...] [--task FILE --candidate FILE ...]\n"
      "                [--action forward_body|full_program] [--device cpu|cuda:N] [--mode fast|full]\n"
      "                [--timeout SECONDS] [--timing-precision F] [--reference-cache-mb MB] [--compile-workers N]\n"
      "                [--per-device N] [--seed S] [--config CONFIG]\n"
      "                [--worker-log FILE] [--log-level LEVEL] [--json]\n"
      "  evaluate candidates in one evaluator (or --per-device N sharing the device), each against the --task\n"
      "  before it; one line each");
  auto* task = sub->add_option("--task", *tasks, "a KernelBench-format task file")->required()->type_name("FILE");
  auto* candidate = sub->add_option("--candidate", *files, "an action to evaluate against the --task before it")
                        ->required()
                        ->type_name("FILE");
  sub->add_option("--action", o->action, "forward_body or full_program (default: the config's)")
      ->check(CLI::IsMember({"forward_body", "full_program"}));
  sub->add_option("--device", o->device, "cpu or cuda:N");
  sub->add_option("--mode", o->mode, "fast or full (default: the config's)")->check(CLI::IsMember({"fast", "full"}));
  sub->add_option("--timeout", o->timeout_s, "seconds per candidate")->check(CLI::PositiveNumber);
  sub->add_option("--timing-precision", o->timing_precision,
                  "timed runs stop once the median is known to within this fraction; 0: every run "
                  "(default: the config's)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--reference-cache-mb", o->reference_cache_mb,
                  "MB of the reference's outputs each judge keeps for a task's later candidates; 0: none "
                  "(default: the config's)")
      ->check(CLI::Range(0.0, 1e9));
  sub->add_option("--compile-workers", o->compile_workers, "compile-stage processes")->check(cli::count(0, 256));
  sub->add_option("--per-device", o->per_device,
                  "evaluators on the device: candidates check at once, timed regions run alone (default 1)")
      ->check(cli::count(1, 64));
  sub->add_option("--seed", o->seed, "the base seed of the inputs");
  sub->add_option("--config", o->config, "a config whose [evaluator] supplies the settings")->type_name("CONFIG");
  sub->add_option("--worker-log", o->worker_log, "where the worker's output goes (default: discarded)")
      ->type_name("FILE");
  sub->add_option("--log-level", o->log_level, "default warn")->type_name("LEVEL");
  sub->add_flag("--json", o->json, "one JSON object per line instead of a table");
  sub->callback([&action, sub, task, candidate, o, tasks, files] {
    // In the order given: each --candidate against the --task before it (the first --task when none is).
    size_t t = 0, c = 0;
    std::string current;
    size_t untasked = 0;
    for (const CLI::Option* opt : sub->parse_order()) {
      if (opt == task) {
        if (current.empty())
          for (size_t k = 0; k < untasked; ++k) o->candidates[k].task = (*tasks)[t];
        current = (*tasks)[t++];
      } else if (opt == candidate) {
        o->candidates.push_back({current, (*files)[c++]});
        untasked += current.empty();
      }
    }
    action = [o] { return cmd_evaluate(*o); };
  });
}

}  // namespace kernelrl

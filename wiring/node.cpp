#include "wiring/node.hpp"

#include "actors/gate.hpp"
#include "actors/monitor.hpp"
#include "actors/sampler.hpp"
#include "core/auth.hpp"
#include "core/log.hpp"
#include "core/mode.hpp"
#include "messages/messages.hpp"
#include "wiring/cluster.hpp"
#include "wiring/inputs.hpp"
#include "wiring/learning.hpp"
#include "wiring/samplers.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

namespace fs = std::filesystem;

namespace kernelrl {

// Whether a node renders the tasks' prompts: a sampler, or the learner of self-distillation (its
// teacher's prompts).
bool renders_prompts(const Config& cfg, const NodeConfig& node) {
  return has_role(node, "sampler") || (has_role(node, "learner") && cfg.experiment.mode == Mode::sdpo);
}

namespace {

// What a node prepares before it joins: its log folder (and what of it this process made), and
// for a sampler or a self-distilling learner the tasks' prompts as the head renders them, and
// the sampler's models (a model that does not load is a clear error here, not a dead sampler
// later).
struct NodePreparation {
  std::string log_dir;
  std::vector<fs::path> made;  // created here: removed again (when still empty) if the head never takes it
  std::vector<RenderedPrompt> rendered;
  SamplerArgs sampling;
  std::vector<std::shared_ptr<SamplerBackend>> backends;
};

bool prepare_node(const Config& cfg, const NodeConfig& node, NodePreparation& out, std::string& err) {
  out.log_dir = (fs::path(cfg.experiment.run_root) / ("node-" + sanitize_id(node.name))).string();
  std::error_code probe;
  for (auto p : {fs::path(cfg.experiment.run_root), fs::path(out.log_dir)})
    if (!fs::exists(p, probe)) out.made.push_back(p);
  fs::create_directories(out.log_dir);
  if (renders_prompts(cfg, node)) {
    TaskSet tasks, eval_tasks;
    if (!load_experiment_tasks(cfg, tasks, eval_tasks, err) ||
        !render_task_prompts(cfg, tasks, eval_tasks, out.rendered, err))
      return false;
  }
  if (has_role(node, "sampler")) {
    out.sampling = sampler_settings(cfg);
    for (auto& p : out.rendered) out.sampling.prompts.push_back({p.task_id, p.prompt, p.prompt_tokens, p.user});
    try {
      out.backends = make_backends(cfg, out.log_dir, node, false);
    } catch (const std::exception& e) {
      err = e.what();
      return false;
    }
  }
  return true;
}

// The learner role on a joined node: the head names the run directory (its checkpoints go there,
// on this machine) and whether the run resumes; the model loads, then the learner registers.
// Returns 0, or the process's exit code.
int start_learner(caf::scoped_actor& self, const caf::actor& gate, const Config& cfg, const NodeConfig& node,
                  const std::string& how, const std::vector<RenderedPrompt>& rendered, LearningActors& learning) {
  auto lg = log::get("node");
  auto& sys = self->home_system();
  std::string run_dir, fail;
  bool resume = false;
  self->request(gate, std::chrono::seconds(30), learner_atom::value)
      .receive(
          [&](std::string& dir, bool r) {
            run_dir = std::move(dir);
            resume = r;
          },
          [&](caf::error& e) { fail = error_text(sys, e); });
  if (!fail.empty()) {
    std::fprintf(stderr, "launch: %s: the head did not take this node's learner: %s\n", how.c_str(), fail.c_str());
    return 2;
  }
  std::map<std::string, std::string> users;
  for (auto& p : rendered) users[p.task_id] = p.user;
  try {
    fs::create_directories(fs::path(run_dir) / "checkpoints");
    learning = spawn_learning(sys, cfg, users, run_dir, make_engine(cfg, run_dir, resume));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch: %s: %s\n", how.c_str(), e.what());
    return 2;
  }
  bool registered = false;
  self->request(gate, std::chrono::seconds(30), register_atom::value, learner_atom::value,
                caf::actor_cast<caf::actor>(learning.learner),
                caf::actor_cast<caf::actor>(learning.selector))  // typed handles cross nodes untyped
      .receive([&](bool) { registered = true; },
               [&](caf::error& e) {
                 lg->error("node {}: the head did not take its learner: {}", node.name, error_text(sys, e));
               });
  if (!registered) {
    self->send_exit(learning.learner, caf::exit_reason::user_shutdown);
    self->send_exit(learning.selector, caf::exit_reason::user_shutdown);
    return 1;
  }
  lg->info("node {}: the learner runs here; checkpoints in {}/checkpoints", node.name, run_dir);
  return 0;
}

// The monitor role on a joined node: the head names the run directory (metrics.jsonl goes there,
// on this machine) and the supervisor that stores the snapshots; the gate hands it every source.
// Returns 0, or the process's exit code.
int start_monitor(caf::scoped_actor& self, const caf::actor& gate, const Config& cfg, const NodeConfig& node,
                  const std::string& how, monitor_actor& monitor) {
  auto lg = log::get("node");
  auto& sys = self->home_system();
  std::string run_dir, fail;
  caf::actor recorder;
  self->request(gate, std::chrono::seconds(30), monitor_atom::value)
      .receive(
          [&](std::string& dir, caf::actor& r) {
            run_dir = std::move(dir);
            recorder = std::move(r);
          },
          [&](caf::error& e) { fail = error_text(sys, e); });
  if (!fail.empty()) {
    std::fprintf(stderr, "launch: %s: the head did not take this node's monitor: %s\n", how.c_str(), fail.c_str());
    return 2;
  }
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  auto ma = monitor_settings(cfg, run_dir);
  if (!ma) return 2;
  monitor = spawn_monitor(sys, std::move(*ma), {}, caf::actor_cast<telemetry_recorder>(recorder));  // came untyped
  bool registered = false;
  self->request(gate, std::chrono::seconds(30), register_atom::value, monitor_atom::value,
                caf::actor_cast<caf::actor>(monitor))  // a typed handle travels as caf::actor
      .receive([&](bool) { registered = true; },
               [&](caf::error& e) {
                 lg->error("node {}: the head did not take its monitor: {}", node.name, error_text(sys, e));
               });
  if (!registered) {
    self->send_exit(monitor, caf::exit_reason::user_shutdown);
    return 1;
  }
  lg->info("node {}: the monitor runs here; metrics in {}/{}", node.name, run_dir, cfg.monitor.metrics_file);
  return 0;
}

// The node's samplers, each registered with the head (one it does not take is stopped): appended
// to `actors`.
void start_samplers(caf::scoped_actor& self, const caf::actor& gate, const NodeConfig& node,
                    const NodePreparation& prep, std::vector<caf::actor>& actors) {
  auto lg = log::get("node");
  auto& sys = self->home_system();
  const std::string digest = prompts_digest(prep.rendered);
  for (size_t i = 0; i < prep.backends.size(); ++i) {
    SamplerArgs one = prep.sampling;
    one.backend = prep.backends[i];
    one.id = sampler_name(node, false, i);
    const std::string id = one.id;
    // Its rollouts go through the head's gate, which takes them as the dispatcher does.
    auto s = spawn_sampler(sys, std::move(one), caf::actor_cast<rollout_sink>(gate));
    bool registered = false;
    self->request(gate, std::chrono::seconds(30), register_atom::value, sampler_atom::value,
                  caf::actor_cast<caf::actor>(s), id, digest)
        .receive([&](bool) { registered = true; },
                 [&](caf::error& e) {
                   lg->error("node {}: the head did not take sampler {}: {}", node.name, id, error_text(sys, e));
                 });
    if (!registered) {
      self->send_exit(s, caf::exit_reason::user_shutdown);
      continue;
    }
    actors.push_back(caf::actor_cast<caf::actor>(s));
  }
}

// Runs until the head is gone (the run ended, or the link went silent past peer_timeout_s) or
// every one of `actors` stopped (1); stops them.
int run_until_the_head_is_gone(caf::scoped_actor& self, const caf::actor& gate, const std::string& name,
                               const std::vector<caf::actor>& actors) {
  auto lg = log::get("node");
  auto& sys = self->home_system();
  self->monitor(gate);
  for (auto& a : actors) self->monitor(a);
  size_t alive = actors.size();
  int rc = 0;
  bool head_gone = false;
  while (!head_gone && alive > 0) {
    self->receive([&](caf::down_msg& dm) {
      if (dm.source == gate.address()) {
        head_gone = true;
        // In words: CAF's exit reasons are not for people.
        const std::string why =
            !dm.reason || dm.reason == caf::exit_reason::user_shutdown || dm.reason == caf::exit_reason::normal
                ? "the run ended"
            : dm.reason == caf::exit_reason::remote_link_unreachable ? "the connection to it was lost"
                                                                     : sys.render(dm.reason);
        lg->info("node {}: the head is gone ({}); stopping", name, why);
      } else {
        --alive;
      }
    });
  }
  if (alive == 0 && !head_gone) {
    lg->error("node {}: every evaluator, sampler, learner and monitor stopped (see the errors above)", name);
    rc = 1;
  }
  for (auto& a : actors) self->send_exit(a, caf::exit_reason::user_shutdown);
  return rc;
}

}  // namespace

int serve_node(const Config& cfg, const NodeConfig& node, const std::string& how) {
  auto lg = log::get("node");
  const std::string& name = node.name;
  std::string err;
  auto secret = read_cluster_secret(cfg.cluster, err);
  NodePreparation prep;
  if (!secret || !prepare_node(cfg, node, prep, err)) {
    std::fprintf(stderr, "launch: %s: %s\n", how.c_str(), err.c_str());
    return 2;
  }
  std::string host;
  uint16_t port = 0;
  head_address(cfg, host, port);

  caf::actor_system_config sys_cfg;
  add_message_types(sys_cfg);
  configure_middleman(sys_cfg, cfg.cluster);
  sys_cfg.set("logger.verbosity", caf::atom("quiet"));
  auto sysp = std::make_unique<caf::actor_system>(sys_cfg);
  auto& sys = *sysp;
  const int code = [&]() -> int {
    bool refused = false;
    // The join is made by an actor that lives as long as this node: the head watches it, and
    // its connection dropping ends this node's membership.
    caf::scoped_actor self{sys};
    auto joined = join_cluster(self, host, port, name, cfg.cluster.name, *secret,
                               std::max(1.0, cfg.cluster.join_wait_s), err, refused, nullptr);
    if (!joined) {
      std::fprintf(stderr, "launch: %s: %s\n", how.c_str(), err.c_str());
      std::error_code ignored;
      for (auto it = prep.made.rbegin(); it != prep.made.rend(); ++it) fs::remove(*it, ignored);  // (only if empty)
      return refused ? 2 : 1;
    }
    caf::actor gate = *joined;
    std::printf("node %s joined cluster %s at %s:%u\n", name.c_str(), cfg.cluster.name.c_str(), host.c_str(),
                unsigned(port));
    std::fflush(stdout);

    LearningActors learning;
    if (has_role(node, "learner") && traits(cfg.experiment.mode).learns)
      if (int rc = start_learner(self, gate, cfg, node, how, prep.rendered, learning)) return rc;
    monitor_actor monitor;
    if (has_role(node, "monitor"))
      if (int rc = start_monitor(self, gate, cfg, node, how, monitor)) return rc;
    std::vector<caf::actor> actors;  // evaluators, then samplers, then the learner and its selector
    for (auto& ea : node_evaluators(cfg, node, prep.log_dir))
      actors.push_back(caf::actor_cast<caf::actor>(spawn_evaluator(sys, ea, gate)));
    const size_t evaluators = actors.size();
    start_samplers(self, gate, node, prep, actors);
    lg->info("node {}: {} evaluator(s) and {} sampler(s) started; logs in {}", name, evaluators,
             actors.size() - evaluators, prep.log_dir);
    if (learning.learner) {
      actors.push_back(caf::actor_cast<caf::actor>(learning.learner));
      actors.push_back(caf::actor_cast<caf::actor>(learning.selector));
    }
    if (monitor) actors.push_back(caf::actor_cast<caf::actor>(monitor));
    return run_until_the_head_is_gone(self, gate, name, actors);
  }();
  stop_actor_system(std::move(sysp), std::chrono::seconds(10), code);
  return code;
}

}  // namespace kernelrl

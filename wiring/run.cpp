#include "wiring/run.hpp"

#include "actors/checkpoint_selector.hpp"
#include "actors/dispatcher.hpp"
#include "actors/evaluator.hpp"
#include "actors/gate.hpp"
#include "actors/learner.hpp"
#include "actors/monitor.hpp"
#include "actors/reward.hpp"
#include "actors/supervisor.hpp"
#include "core/log.hpp"
#include "core/mode.hpp"
#include "core/tls.hpp"
#include "experiment/assemble.hpp"
#include "messages/messages.hpp"
#include "wiring/cluster.hpp"
#include "wiring/learning.hpp"
#include "wiring/samplers.hpp"

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

namespace fs = std::filesystem;

namespace kernelrl {

void RunActors::stop() {
  if (gate) unpublish_gate(gate);
  for (auto& a :
       {caf::actor_cast<caf::actor>(monitor), caf::actor_cast<caf::actor>(dispatcher),
        caf::actor_cast<caf::actor>(reward), caf::actor_cast<caf::actor>(supervisor), caf::actor_cast<caf::actor>(gate),
        caf::actor_cast<caf::actor>(learner), caf::actor_cast<caf::actor>(selector)})
    if (a) anon_send_exit(a, caf::exit_reason::user_shutdown);
  for (auto& s : samplers) anon_send_exit(s, caf::exit_reason::user_shutdown);
  for (auto& e : evaluators) anon_send_exit(e, caf::exit_reason::user_shutdown);
}

std::optional<RunActors> spawn_run(caf::actor_system& sys, const Config& cfg, RunInputs in, const std::string& run_dir,
                                   const std::string& run_id, bool resume,
                                   std::vector<std::shared_ptr<SamplerBackend>> backends,
                                   std::shared_ptr<LearnerEngine> engine, const std::string& secret,
                                   const std::string& config_path) {
  auto lg = log::get("launch");
  const bool cluster = is_cluster(cfg);
  RunActors run;
  std::vector<EvaluatorArgs> eval_args;
  const std::string worker_logs = (fs::path(run_dir) / "workers").string();
  for (auto& node : cfg.nodes) {  // in a cluster the other nodes' evaluators come with their nodes
    if (cluster && &node != &head_node(cfg)) continue;
    for (auto& ea : node_evaluators(cfg, node, worker_logs)) eval_args.push_back(ea);
  }
  SupervisorArgs sa;
  sa.experiment = experiment_args(cfg, in.ids(in.tasks), in.ids(in.eval_tasks), run_id, run_dir);
  sa.store_path = (fs::path(run_dir) / cfg.store.file).string();
  sa.synchronous = cfg.store.synchronous;
  sa.config_toml = cfg.resolved_toml;
  sa.resume = resume;
  if (cluster) {
    sa.join_wait_s = cfg.cluster.join_wait_s;
    for (auto& node : cfg.nodes)  // (a node whose GPUs are "auto" may find none: it is awaited all the same)
      if (&node != &head_node(cfg) &&
          (!evaluator_devices(node).empty() || (node.gpus_auto && has_role(node, "evaluator"))))
        sa.evaluator_nodes.push_back(node.name);
  }
  if (traits(cfg.experiment.mode).learns) {
    if (const NodeConfig* ln = learner_node(cfg)) {  // it joins from its node
      sa.learner_node = ln->name;
    } else {
      auto la = spawn_learning(sys, cfg, in.user_messages, run_dir, std::move(engine));
      run.learner = sa.learner = la.learner;
      run.selector = sa.selector = la.selector;
    }
  }
  run.supervisor = spawn_supervisor(sys, sa);
  run.reward = spawn_reward(sys, cfg.reward, run.supervisor);
  DispatcherArgs da;
  for (auto* set : {&in.tasks, &in.eval_tasks})
    for (auto& t : set->tasks()) da.task_paths[t.id] = t.path;
  da.action_space = cfg.evaluator.action_space;
  da.mode = cfg.evaluator.mode;
  da.seed = cfg.evaluator.seed;
  da.max_in_flight = cfg.evaluator.in_flight();
  da.max_attempts = cfg.evaluator.max_attempts;
  da.max_queue = cfg.sampler.max_pending;
  run.dispatcher = spawn_dispatcher(sys, da, run.reward);
  for (auto& ea : eval_args)
    run.evaluators.push_back(
        caf::actor_cast<caf::actor>(spawn_evaluator(sys, ea, caf::actor_cast<caf::actor>(run.dispatcher))));
  SamplerArgs sma = sampler_settings(cfg);
  sma.records = std::move(in.records);
  sma.prompts = std::move(in.prompts);
  for (size_t i = 0; i < backends.size(); ++i) {
    SamplerArgs one = sma;
    one.backend = backends[i];
    one.id = sampler_name(head_node(cfg), true, i);
    run.samplers.push_back(spawn_sampler(sys, std::move(one), run.dispatcher));
  }
  if (backends.size() > 1)
    lg->info("{} samplers ({} backend): each step's groups are spread over them", backends.size(), cfg.sampler.backend);
  const NodeConfig* mon_node = monitor_node(cfg);
  std::optional<MonitorArgs> ma;
  if (!mon_node) {
    ma = monitor_settings(cfg, run_dir);
    if (!ma) {
      run.stop();
      return std::nullopt;
    }
  }
  std::vector<telemetry_source> watched{run.supervisor, run.dispatcher};
  for (auto& s : run.samplers) watched.emplace_back(s);
  if (run.learner) watched.emplace_back(run.learner);
  if (ma)
    run.monitor = spawn_monitor(sys, *ma, watched, run.supervisor);
  else
    lg->info("the monitor runs on node {}: it joins the head with `launch {} --node {}`", mon_node->name, config_path,
             mon_node->name);
  if (!cluster) return run;
  const auto& head = head_node(cfg);  // it listens on its own host and port
  GateArgs ga;
  ga.cluster = cfg.cluster.name;
  ga.secret = secret;
  ga.prompts_digest = in.prompts_digest;
  if (!sa.learner_node.empty()) {  // learning modes only
    ga.learner_node = sa.learner_node;
    ga.run_dir = fs::absolute(run_dir).string();
    ga.resume = resume;
  }
  if (mon_node) {
    ga.monitor_node = mon_node->name;
    ga.run_dir = fs::absolute(run_dir).string();
    ga.recorder = caf::actor_cast<caf::actor>(run.supervisor);  // it travels to the monitor node untyped
    for (auto& w : watched) ga.sources.emplace_back(caf::actor_cast<caf::actor>(w), "head");  // they travel untyped
  }
  run.gate = spawn_gate(sys, ga, run.dispatcher, run.supervisor, run.monitor);
  auto bound = publish_gate(run.gate, head.port, head.host);
  if (!bound) {
    lg->error("cannot listen on {}:{}: {}", head.host, head.port, sys.render(bound.error()));
    run.stop();
    return std::nullopt;
  }
  lg->info(
      "cluster {}: head listening on {}:{}; nodes join with `launch {} --node NAME` (or --join), "
      "monitors attach with `launch monitor {}:{}`",
      cfg.cluster.name, head.host, *bound, config_path, head.host, *bound);
  if (cfg.cluster.tls)
    lg->info("cluster {}: links are TLS with certificates both ways: this head is {}; peers must verify against {}",
             cfg.cluster.name, tls_identity(cfg.cluster.tls_cert), cfg.cluster.tls_ca);
  else if (head.host != "127.0.0.1" && head.host != "localhost" && head.host.rfind("127.", 0) != 0)
    lg->warn(
        "cluster {}: {} is not a loopback address and the link between nodes is not encrypted (peers prove the "
        "cluster secret both ways, but actions, verdicts and weights cross the network in plain text): keep the "
        "nodes on a private network, or set [cluster] tls = true",
        cfg.cluster.name, head.host);
  return run;
}

std::string run_to_summary(caf::actor_system& sys, RunActors& run) {
  caf::scoped_actor self{sys};
  std::string summary;
  self->request(run.supervisor, caf::infinite, plan_atom::value, as_actors(run.samplers), run.evaluators)
      .receive([&](std::string& s) { summary = std::move(s); },
               [&](caf::error& e) {
                 summary = nlohmann::json{{"ok", false}, {"error", sys.render(e)}}.dump();
               });
  // The last snapshot: from this process's monitor, or through the gate from a monitor node's.
  final_snapshot last = run.monitor ? final_snapshot{run.monitor} : final_snapshot{run.gate};
  if (last) self->request(last, std::chrono::seconds(12), finish_atom::value).receive([](bool) {}, [](caf::error&) {});
  run.stop();
  return summary;
}

}  // namespace kernelrl

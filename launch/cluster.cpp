// `launch CONFIG --node NAME` and `launch CONFIG --join`: which node this process is (a [[node]] of
// CONFIG, or a machine joining as an evaluator), checked; then wiring/node.cpp serves its roles
// until the head is gone.
#include "launch/cluster.hpp"
#include "launch/commands.hpp"
#include "launch/setup.hpp"
#include "wiring/node.hpp"

#include <cstdio>

#include <unistd.h>

namespace kernelrl {

int run_node(const Config& cfg, const std::string& name) {
  const NodeConfig* node = nullptr;
  std::string names;
  for (auto& n : cfg.nodes) {
    names += (names.empty() ? "" : ", ") + n.name;
    if (n.name == name) node = &n;
  }
  if (!node) {
    std::fprintf(stderr,
                 "launch: --node %s: %s has no such [[node]] (it has %s); a machine not in the "
                 "file joins with --join\n",
                 name.c_str(), cfg.source_file.c_str(), names.c_str());
    return 2;
  }
  if (&head_node(cfg) == node) {
    std::fprintf(stderr,
                 "launch: --node %s: that is the head (it has the supervisor role); start it with `launch %s`\n",
                 name.c_str(), cfg.source_file.c_str());
    return 2;
  }
  for (auto& r : node->roles) {
    if (r != "evaluator" && r != "sampler" && r != "learner" && r != "monitor") {
      std::fprintf(stderr,
                   "launch: --node %s: role \"%s\" runs on the head only; "
                   "a node of its own runs evaluators, samplers, the learner and the monitor\n",
                   name.c_str(), r.c_str());
      return 2;
    }
  }
  if (!check_listed_gpus(cfg, *node)) return 2;
  return serve_node(cfg, *node, "--node " + name);
}

int run_join(const Config& cfg, const JoinOptions& o) {
  NodeConfig node;
  node.name = o.name;
  if (node.name.empty()) {
    char buf[256] = {0};
    gethostname(buf, sizeof buf - 1);
    node.name = buf[0] ? buf : "joined";
  }
  for (auto& n : cfg.nodes) {
    if (n.name == node.name) {
      std::fprintf(stderr,
                   "launch: --join: %s already has a [[node]] named \"%s\"; start it with --node %s, "
                   "or give this machine another name with --name\n",
                   cfg.source_file.c_str(), node.name.c_str(), node.name.c_str());
      return 2;
    }
  }
  node.roles = {"evaluator"};
  node.cpu_slots = o.cpu_slots;
  node.gpus = o.gpus;
  if (node.cpu_slots == 0 && node.gpus.empty()) {
    std::fprintf(stderr, "launch: --join: say what this machine evaluates on: --gpus 0,1 or --cpu-slots N\n");
    return 2;
  }
  if (!check_listed_gpus(cfg, node)) return 2;
  return serve_node(cfg, node, "--join (as " + node.name + ")");
}

int cmd_node(const std::string& config_path, const std::string& node, const std::string& log_level) {
  // The chat template is resolved (and said) only where this node renders prompts.
  auto cfg = load_with_level(config_path, log_level, false);
  if (!cfg) return 2;
  for (auto& n : cfg->nodes)
    if (n.name == node && renders_prompts(*cfg, n)) resolve_chat_template(*cfg);
  return run_node(*cfg, node);
}

int cmd_join(const std::string& config_path, const JoinOptions& o, const std::string& log_level) {
  auto cfg = load_with_level(config_path, log_level, false);  // an evaluator only: no prompts
  if (!cfg) return 2;
  if (!is_cluster(*cfg)) {
    std::fprintf(stderr, "launch: --join: %s describes no cluster (no [[node]] has a port)\n",
                 cfg->source_file.c_str());
    return 2;
  }
  return run_join(*cfg, o);
}

}  // namespace kernelrl

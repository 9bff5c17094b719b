// Pieces of `launch` shared by the head (cmd_run) and the other nodes (cmd_node): which node is
// the head and where it listens, the middleman's settings, and the evaluators a node runs.
#pragma once

#include "actors/evaluator.hpp"
#include "core/config.hpp"

#include <caf/fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kernelrl {

// A cluster: some node publishes a port (else everything runs in one process).
bool is_cluster(const Config& cfg);
// The node with the supervisor role (config validation guarantees one).
const NodeConfig& head_node(const Config& cfg);
// Where nodes reach the head: [cluster] head, else the head node's host and port.
void head_address(const Config& cfg, std::string& host, uint16_t& port);
// Loads the io middleman with heartbeats and the peer timeout of [cluster].
void configure_middleman(caf::actor_system_config& sys_cfg, const ClusterConfig& cluster);
// One evaluator per CPU slot and per GPU of `node`; worker logs go to `log_dir`.
std::vector<EvaluatorArgs> node_evaluators(const Config& cfg, const NodeConfig& node, const std::string& log_dir);
// `launch CONFIG --node NAME` once CONFIG is loaded: exit code.
int run_node(const Config& cfg, const std::string& name);

}  // namespace kernelrl

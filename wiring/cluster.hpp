// The run's wiring shared by the head (launch CONFIG) and the other nodes (--node, --join): which
// node is the head and where it listens, the middleman's settings, the evaluators a node runs,
// joining a cluster and ending the actor system.
#pragma once

#include "actors/evaluator.hpp"
#include "actors/monitor.hpp"
#include "core/config.hpp"
#include "core/machine.hpp"

#include <caf/fwd.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kernelrl {

// `s` as a part of a file name: every character but letters, digits, '-', '_' and '.' made '_'.
std::string sanitize_id(std::string s);
// Whether `n` has `role` (supervisor, learner, sampler, evaluator, monitor).
bool has_role(const NodeConfig& n, const std::string& role);
// A cluster: some node publishes a port (else everything runs in one process).
bool is_cluster(const Config& cfg);
// The node with the supervisor role (config validation guarantees one).
const NodeConfig& head_node(const Config& cfg);
// In a cluster, the node other than the head that has the learner role (its learner and checkpoint
// selector join the head from there); null when the head runs the learner.
const NodeConfig* learner_node(const Config& cfg);
// The node other than the head with the monitor role, if any (then the head runs no monitor).
const NodeConfig* monitor_node(const Config& cfg);
// The monitor's settings for a run writing under `run_dir` ([monitor]: progress line, interval,
// metrics file, the ZeroMQ publisher bound on this machine); nullopt after logging why not.
std::optional<MonitorArgs> monitor_settings(const Config& cfg, const std::string& run_dir);
// Where nodes reach the head: [cluster] head, else the head node's host and port.
void head_address(const Config& cfg, std::string& host, uint16_t& port);
// The middleman with the cluster's heartbeat and timeout; with [cluster] tls also CAF's OpenSSL
// module and this machine's certificate, key and CA (every link then TLS, certificates both ways).
void configure_middleman(caf::actor_system_config& sys_cfg, const ClusterConfig& cluster);

// The head's gate listening on host:port (through TLS when the system has the OpenSSL module).
caf::expected<uint16_t> publish_gate(const gate_actor& typed, uint16_t port, const std::string& host);
void unpublish_gate(const gate_actor& gate);
// The devices a node's evaluators run on ("cpu-0", ..., "cuda:0", ...); none without the role.
std::vector<std::string> evaluator_devices(const NodeConfig& node);
// The candidates' memory plan of node's evaluators on its machine, counting the evaluators of the
// config's other nodes at the same host; *shared_with (optional) names them for the log.
MemoryPlan node_memory_plan(const Config& cfg, const NodeConfig& node, std::string* shared_with = nullptr);

// One evaluator per CPU slot and per GPU of `node`; worker logs go to `log_dir`.
std::vector<EvaluatorArgs> node_evaluators(const Config& cfg, const NodeConfig& node, const std::string& log_dir);
// Destroys the actor system (which waits for every actor to be gone), for at most `grace`; past
// it the process ends at once with `code`, its logs flushed. CAF 0.17 can keep a detached actor
// alive until its last request's timeout or hang on its thread at shutdown (CAF issues 698 and
// 1196, fixed in 0.18): a process whose work is done must not linger for that. (Evaluator workers
// end with their parent: they watch it.)
void stop_actor_system(std::unique_ptr<caf::actor_system> sys, std::chrono::seconds grace, int code);

// Connects to the head's gate at host:port (retrying for wait_s) and proves the secret as peer
// `name` of `cluster` ("": the name the head announces). The gate, or nullopt with `err` and
// `refused` (true: the head answered and said no; false: it could not be reached). `self` makes
// the join and holds it: the membership ends when `self` ends or its connection drops.
std::optional<caf::actor> join_cluster(caf::scoped_actor& self, const std::string& host, uint16_t port,
                                       const std::string& name, const std::string& cluster, const std::string& secret,
                                       double wait_s, std::string& err, bool& refused, std::string* cluster_seen);

}  // namespace kernelrl

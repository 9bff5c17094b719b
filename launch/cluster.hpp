// `launch CONFIG --node NAME` and `launch CONFIG --join`: a node of a cluster (launch/cluster.cpp;
// its roles are served by wiring/node.hpp; what it shares with the head is wiring/cluster.hpp).
#pragma once

#include "core/config.hpp"
#include "wiring/cluster.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace kernelrl {

// `launch CONFIG --node NAME` once CONFIG is loaded: exit code.
int run_node(const Config& cfg, const std::string& name);

// `launch CONFIG --join`: a machine not in CONFIG runs evaluators for its head.
struct JoinOptions {
  std::string name;           // node name ("": this machine's host name)
  uint32_t cpu_slots = 0;     // CPU evaluators
  std::vector<int64_t> gpus;  // CUDA device ids, one evaluator each
};
int run_join(const Config& cfg, const JoinOptions& o);

}  // namespace kernelrl

// A node of a cluster (`launch CONFIG --node NAME`, `launch CONFIG --join`) once it knows which
// node it is: it prepares its roles (the tasks' prompts as the head renders them, its samplers'
// models), proves the cluster secret to the head's gate, runs its evaluators for the head's
// dispatcher, its samplers for the head's supervisor, and the learner or the monitor where it has
// their roles, until the head is gone.
#pragma once

#include "core/config.hpp"

#include <string>

namespace kernelrl {

// Whether `node` renders the tasks' prompts: a sampler, or the learner of self-distillation (its
// teacher's prompts).
bool renders_prompts(const Config& cfg, const NodeConfig& node);

// Runs `node`'s roles for the head until the head is gone; the process's exit code (2: a bad
// setting, or the head refused the node; 1: the head could not be reached, or every role stopped).
// `how` names the command in errors ("--node NAME", "--join (as NAME)").
int serve_node(const Config& cfg, const NodeConfig& node, const std::string& how);

}  // namespace kernelrl

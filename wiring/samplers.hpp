// The samplers a `launch` process runs, on the head or on a sampler node: their model backends
// (one per device or inference server of the node) and the settings every sampler of a run shares.
#pragma once

#include "actors/sampler.hpp"
#include "core/config.hpp"

#include <memory>
#include <string>
#include <vector>

namespace kernelrl {

class SamplerBackend;

// The backends of `node`'s samplers: libtorch, one per sampler_devices entry (else [sampler]
// devices, else [policy] device); openai, one per sampler_urls entry (else [sampler] urls, else
// url), each writing its adapters under adapter_dir/NAME (its own folder when there are several,
// or on a node other than the head); replay, one null backend. Throws when a model does not load.
std::vector<std::shared_ptr<SamplerBackend>> make_backends(const Config& cfg, const std::string& run_dir,
                                                           const NodeConfig& node, bool head);
// The name of `node`'s i-th sampler, recorded with its rollouts and its telemetry: "sampler-i"
// on the head, "sampler-NODE-i" on another node.
std::string sampler_name(const NodeConfig& node, bool head, size_t i);
// What every sampler of the run shares: sampling parameters, batching, top-m and failure limit
// (no backend, prompts or replay records).
SamplerArgs sampler_settings(const Config& cfg);

}  // namespace kernelrl

#include "core/machine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace kernelrl {

namespace {

// The first number in `path` (bytes), or 0 ("max", missing, unreadable).
uint64_t read_bytes(const std::string& path) {
  std::ifstream in(path);
  uint64_t v = 0;
  if (!(in >> v)) return 0;
  return v;
}

}  // namespace

uint64_t machine_memory_mb() {
  uint64_t total_kb = 0;
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("MemTotal:", 0) != 0) continue;
    std::istringstream(line.substr(9)) >> total_kb;
    break;
  }
  uint64_t mb = total_kb / 1024;
  // A container's limit, when lower (cgroup v2, then v1; "max" and v1's huge default read as none).
  for (const char* p : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    uint64_t limit = read_bytes(p) >> 20;
    if (limit > 0 && (mb == 0 || limit < mb)) mb = limit;
  }
  return mb;
}

StepPlan plan_step(const Config& cfg, uint64_t machine_mb) {
  StepPlan p;
  p.machine_mb = machine_mb;
  const bool learns = traits(cfg.experiment.mode).learns;
  const uint64_t n = learns ? cfg.learner.group_size : std::max<uint32_t>(1, cfg.sampler.samples_per_task);
  if (cfg.sampler.backend != "replay") p.generation = uint64_t(std::max<uint32_t>(1, cfg.sampler.batch_prompts)) * n;
  if (learns) p.step = uint64_t(cfg.learner.batch_size) * cfg.learner.group_size;
  p.bytes_per_sample = 16 * uint64_t(cfg.sampler.max_tokens) + (16 << 10);
  return p;
}

std::string StepPlan::problem() const {
  if (machine_mb == 0) return "";
  const long double room = (long double)machine_mb * (1 << 20) / 2;
  const auto gb = [&](uint64_t samples) {
    return fmt::format("{:.0f} GB", (long double)samples * bytes_per_sample / (1u << 30));
  };
  const auto est = fmt::format("about {} KB each with [sampler] max_tokens", (bytes_per_sample + 1023) >> 10);
  if (step > 0 && (long double)step * bytes_per_sample > room)
    return fmt::format(
        "[learner] batch_size x group_size = {} samples a step ({}: {}) cannot be held on this machine, which has "
        "{} MB (half of it for the run's samples); lower [learner] batch_size or group_size",
        step, est, gb(step), machine_mb);
  if (generation > 0 && (long double)generation * bytes_per_sample > room)
    return fmt::format(
        "[sampler] batch_prompts x {} = {} samples generated together ({}: {}) cannot be held on this machine, which "
        "has {} MB (half of it for the run's samples); lower [sampler] batch_prompts or {}",
        step > 0 ? "[learner] group_size" : "the samples of a task", generation, est, gb(generation), machine_mb,
        step > 0 ? "[learner] group_size" : "[sampler] samples_per_task ([experiment] k)");
  return "";
}

std::string MemoryPlan::advice() const {
  if (is_auto)
    return "memory_limit_mb is \"auto\" and at its least (1 GB a candidate): run fewer candidates at once (lower "
           "[evaluator] compile_workers, or the node's gpus or cpu_slots)";
  return "lower [evaluator] memory_limit_mb or set it to \"auto\"";
}

bool MemoryPlan::exceeds() const {
  return per_candidate_mb > 0 && machine_mb > 0 && uint64_t(per_candidate_mb) * at_once + headroom_mb > machine_mb;
}

std::string MemoryPlan::describe() const {
  if (per_candidate_mb == 0)
    return fmt::format("no memory limit per candidate ({} at once on a machine of {} MB)", at_once, machine_mb);
  return fmt::format(
      "memory_limit_mb {}{} per candidate x {} at once = {} MB of this machine's {} MB ({} MB kept for the head, "
      "the workers and the compilers)",
      per_candidate_mb, is_auto ? " (auto)" : "", at_once, uint64_t(per_candidate_mb) * at_once, machine_mb,
      headroom_mb);
}

MemoryPlan plan_candidate_memory(const EvaluatorConfig& e, uint32_t evaluators, uint64_t machine_mb) {
  MemoryPlan p;
  p.machine_mb = machine_mb;
  p.headroom_mb = std::max<uint64_t>(4096, machine_mb / 8);
  p.at_once = std::max<uint32_t>(1, evaluators * (1 + e.compile_workers));
  p.is_auto = e.memory_auto;
  if (!e.memory_auto) {
    p.per_candidate_mb = e.memory_limit_mb;
    return p;
  }
  const uint64_t room = machine_mb > p.headroom_mb ? machine_mb - p.headroom_mb : 0;
  // At least 1 GB (a task's inputs and PyTorch itself), at most 32 GB (no task needs more of the host).
  p.per_candidate_mb = uint32_t(std::clamp<uint64_t>(room / p.at_once, 1024, 32768));
  return p;
}

}  // namespace kernelrl

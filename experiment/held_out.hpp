#pragma once
// Held-out evaluation rounds of a learning run: the served policy of the first version, of every
// eval_every-th and of the last one samples each held-out task (Rollout::split "eval", `step` =
// the version evaluated). Their samples are stored and scored per version but never learned from.

#include "experiment/experiment.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kernelrl {

class HeldOutRounds {
 public:
  HeldOutRounds(std::vector<std::string> task_ids, uint32_t every, uint32_t samples)
      : task_ids_(std::move(task_ids)), every_(every), samples_(samples) {}
  bool any() const { return !task_ids_.empty(); }
  const std::vector<std::string>& task_ids() const { return task_ids_; }
  // Whether version v is one of the periodic rounds (the first and the last are planned by the loop).
  bool periodic(uint64_t v) const { return every_ > 0 && v % every_ == 0; }
  // Plans the round of version v, once: the selector keeps its checkpoint, the sampler samples every
  // task that has no complete group yet (a round begun before a restart). None when planned before.
  Actions plan(uint32_t v);
  // A stored sample of a round (a new one, or one of a resumed run).
  void add(const ScoredRollout& s);
  // Logs round v once all its samples are in.
  void progress(uint32_t v);
  // Every planned round has all its samples.
  bool done() const;
  // The rounds with samples, and the best of them (the summary's "eval" and "eval_best").
  void summarize(nlohmann::json& j, const std::string& checkpoints) const;
  double last_fast_1() const { return last_fast_1_; }
  uint32_t last_version() const { return last_version_; }

  static constexpr uint64_t group_stride = uint64_t(1) << 20;  // group ids: base + v * stride + j
  static constexpr uint64_t group_base = uint64_t(1) << 62;

 private:
  struct Round {
    uint64_t expected = 0, recorded = 0;                          // samples planned and stored
    uint64_t next_j = 0;                                          // next group number
    std::map<uint64_t, std::pair<std::string, uint32_t>> groups;  // group id -> task, samples stored
    std::map<std::string, TaskAgg> tasks;
    std::map<std::string, uint64_t> status_counts;
    uint64_t min_version = ~uint64_t(0), max_version = 0;  // versions that actually sampled it
    bool reported = false;
  };
  nlohmann::json round_json(uint32_t version, const Round& r, const std::string& checkpoints) const;
  std::vector<std::string> task_ids_;
  uint32_t every_ = 0, samples_ = 1;
  std::map<uint32_t, Round> rounds_;  // by the version evaluated
  double last_fast_1_ = -1;
  uint32_t last_version_ = 0;
};

}  // namespace kernelrl

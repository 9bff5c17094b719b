// The supervisor's view of a run's samplers: which sampler was planned which groups, how many of
// each group's samples are stored, and where a lost sampler's unfinished groups go. Pure (no
// actors): the supervisor calls it as plans go out, samples come in and samplers leave.
#pragma once

#include "messages/messages.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kernelrl {

class SamplerPool {
 public:
  // Sampler i is given work: the plan for it.
  using Assignment = std::pair<size_t, SamplePlan>;

  explicit SamplerPool(size_t samplers);

  // The plan's groups spread over the live samplers, each group whole to one (its samples share a
  // prompt and its prefill), each to the sampler with the fewest samples planned and not yet
  // stored (the lower index on a tie). One sub-plan per sampler given any; none when no sampler
  // is alive (the groups then wait, unowned, for adopt()).
  std::vector<Assignment> assign(const SamplePlan& plan);
  // A sampler joins (a node started late or came back): its index. It is given nothing until
  // the next assign() or adopt().
  size_t add();
  // The groups waiting for a sampler (planned while none was alive, or left by the last one to
  // go), each from its first sample not yet stored, spread over the live samplers as assign()
  // spreads a plan.
  std::vector<Assignment> adopt();
  size_t waiting() const;  // groups no live sampler owns
  // A stored sample of a planned group (others are ignored).
  void arrived(const std::string& task_id, uint64_t group_id, uint32_t sample_index);
  // Sampler i is gone: each of its groups with a sample not yet stored is planned again on the
  // live samplers from that group's first missing sample on (the same sample ids: one that still
  // arrives from before is a duplicate, which the store drops). Empty when nothing was left or no
  // sampler is alive (alive() says which; the groups then wait for adopt()).
  std::vector<Assignment> lost(size_t i);

  size_t size() const { return alive_.size(); }
  size_t alive() const;
  bool is_alive(size_t i) const { return i < alive_.size() && alive_[i]; }
  uint64_t load(size_t i) const { return load_.at(i); }  // samples planned to i, not yet stored
  size_t groups_open() const { return groups_.size(); }

 private:
  static constexpr size_t unowned = SIZE_MAX;
  struct Group {
    uint32_t step = 0, first = 0, n = 0;
    std::string split;
    size_t owner = unowned;
    std::vector<bool> got;  // sample first + k stored
    uint32_t missing = 0;
    uint32_t turn = 0;                          // SamplePlan::turn
    std::vector<std::vector<Attempt>> history;  // turn > 1: sample first + k's earlier attempts
  };
  static Group from_first_missing(const Group& g);
  size_t least_loaded() const;
  std::vector<Assignment> place(const std::vector<std::pair<std::pair<std::string, uint64_t>, Group>>& groups);

  std::map<std::pair<std::string, uint64_t>, Group> groups_;  // (task id, group id) -> group
  std::vector<bool> alive_;
  std::vector<uint64_t> load_;
};

}  // namespace kernelrl

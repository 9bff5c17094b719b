#include "experiment/sampler_pool.hpp"

#include <algorithm>
#include <tuple>

namespace kernelrl {

SamplerPool::SamplerPool(size_t samplers) : alive_(samplers, true), load_(samplers, 0) {}

// What is left of a group to sample: from its first sample not yet stored on (one stored after
// that is asked for again; its second copy is dropped by the store).
SamplerPool::Group SamplerPool::from_first_missing(const Group& g) {
  uint32_t k = 0;
  while (k < g.n && g.got[k]) ++k;
  Group h;
  h.step = g.step;
  h.split = g.split;
  h.first = g.first + k;
  h.n = g.n - k;
  h.got.assign(g.got.begin() + k, g.got.end());
  h.missing = g.missing;
  h.turn = g.turn;
  if (k <= g.history.size()) h.history.assign(g.history.begin() + k, g.history.end());
  return h;
}

size_t SamplerPool::alive() const { return size_t(std::count(alive_.begin(), alive_.end(), true)); }

size_t SamplerPool::least_loaded() const {
  size_t best = alive_.size();
  for (size_t i = 0; i < alive_.size(); ++i)
    if (alive_[i] && (best == alive_.size() || load_[i] < load_[best])) best = i;
  return best;
}

std::vector<SamplerPool::Assignment> SamplerPool::place(
    const std::vector<std::pair<std::pair<std::string, uint64_t>, Group>>& groups) {
  // Sub-plans by sampler and by what a SamplePlan holds once for all its groups (a later turn's
  // group, with its samples' histories, is a plan of its own).
  using Key = std::tuple<size_t, uint32_t, std::string, uint32_t, uint32_t, uint32_t, uint64_t>;  // sampler, step,
                                                                                                  // split, first, n,
                                                                                                  // turn, group
  std::map<Key, SamplePlan> plans;
  for (auto& [key, g0] : groups) {
    const size_t to = least_loaded();
    if (to == alive_.size()) return {};
    Group g = g0;
    g.owner = to;
    load_[to] += g.missing;
    SamplePlan& p = plans[Key{to, g.step, g.split, g.first, g.n, g.turn, g.turn > 1 ? key.second : 0}];
    p.step = g.step;
    p.split = g.split;
    p.first_index = g.first;
    p.n = g.n;
    p.turn = g.turn;
    p.history = g.history;
    p.task_ids.push_back(key.first);
    p.group_ids.push_back(key.second);
    groups_[key] = std::move(g);
  }
  std::vector<Assignment> out;
  for (auto& [k, p] : plans) out.emplace_back(std::get<0>(k), std::move(p));
  return out;
}

std::vector<SamplerPool::Assignment> SamplerPool::assign(const SamplePlan& plan) {
  std::vector<std::pair<std::pair<std::string, uint64_t>, Group>> groups;
  const uint32_t n = std::max<uint32_t>(1, plan.n);
  for (size_t i = 0; i < plan.task_ids.size() && i < plan.group_ids.size(); ++i) {
    Group g;
    g.step = plan.step;
    g.first = plan.first_index;
    g.n = n;
    g.split = plan.split;
    g.got.assign(n, false);
    g.missing = n;
    g.turn = plan.turn;
    if (plan.turn > 1) g.history = plan.history;
    groups.push_back({{plan.task_ids[i], plan.group_ids[i]}, std::move(g)});
  }
  if (alive() == 0) {  // no sampler yet: the groups wait for one
    for (auto& [key, g] : groups) groups_[key] = std::move(g);
    return {};
  }
  return place(groups);
}

size_t SamplerPool::add() {
  alive_.push_back(true);
  load_.push_back(0);
  return alive_.size() - 1;
}

size_t SamplerPool::waiting() const {
  size_t n = 0;
  for (auto& [key, g] : groups_) n += g.owner == unowned || !alive_[g.owner] ? 1 : 0;
  return n;
}

std::vector<SamplerPool::Assignment> SamplerPool::adopt() {
  if (alive() == 0) return {};
  std::vector<std::pair<std::pair<std::string, uint64_t>, Group>> orphans;
  for (auto& [key, g] : groups_)
    if (g.owner == unowned || !alive_[g.owner]) orphans.push_back({key, from_first_missing(g)});
  return place(orphans);
}

void SamplerPool::arrived(const std::string& task_id, uint64_t group_id, uint32_t sample_index) {
  auto it = groups_.find({task_id, group_id});
  if (it == groups_.end()) return;
  Group& g = it->second;
  if (sample_index < g.first || sample_index - g.first >= g.n || g.got[sample_index - g.first]) return;
  g.got[sample_index - g.first] = true;
  --g.missing;
  if (g.owner != unowned && load_[g.owner] > 0) --load_[g.owner];
  if (g.missing == 0) groups_.erase(it);
}

std::vector<SamplerPool::Assignment> SamplerPool::lost(size_t i) {
  if (i >= alive_.size() || !alive_[i]) return {};
  alive_[i] = false;
  load_[i] = 0;
  std::vector<std::pair<std::pair<std::string, uint64_t>, Group>> again;
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (it->second.owner != i) {
      ++it;
      continue;
    }
    again.push_back({it->first, from_first_missing(it->second)});
    it = groups_.erase(it);
  }
  if (alive() == 0) {  // nowhere to go: kept, unowned, until a sampler joins (adopt())
    for (auto& [key, g] : again) groups_[key] = std::move(g);
    return {};
  }
  return place(again);
}

}  // namespace kernelrl

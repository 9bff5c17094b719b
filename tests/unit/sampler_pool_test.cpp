// SamplerPool: a step's groups spread over the samplers by load, whole; a lost sampler's unfinished
// groups planned again elsewhere from their first missing sample, with the same sample ids.
#include "experiment/sampler_pool.hpp"

#include <catch2/catch.hpp>

#include <set>

using namespace kernelrl;

namespace {

SamplePlan plan_of(uint32_t step, std::vector<std::string> tasks, uint32_t n, uint64_t group0) {
  SamplePlan p;
  p.step = step;
  p.n = n;
  p.task_ids = std::move(tasks);
  for (size_t i = 0; i < p.task_ids.size(); ++i) p.group_ids.push_back(group0 + i);
  return p;
}

// Every sample id a set of assignments asks for.
std::multiset<std::string> ids_of(const std::vector<SamplerPool::Assignment>& as) {
  std::multiset<std::string> ids;
  for (auto& [to, p] : as)
    for (size_t i = 0; i < p.task_ids.size(); ++i)
      for (uint32_t k = 0; k < p.n; ++k) ids.insert(make_sample_id(p.task_ids[i], p.group_ids[i], p.first_index + k));
  return ids;
}

}  // namespace

TEST_CASE("a step's groups go whole to the least loaded samplers") {
  SamplerPool pool(3);
  auto as = pool.assign(plan_of(0, {"a", "b", "c", "d", "e"}, 4, 0));
  REQUIRE(as.size() == 3);
  std::set<uint64_t> seen;
  for (auto& [to, p] : as) {
    CHECK(p.n == 4);
    CHECK(p.step == 0);
    REQUIRE(p.task_ids.size() == p.group_ids.size());
    for (auto g : p.group_ids) CHECK(seen.insert(g).second);  // no group twice
  }
  CHECK(seen.size() == 5);
  // 5 groups of 4 over 3 samplers: 8, 8, 4 samples.
  std::multiset<uint64_t> loads{pool.load(0), pool.load(1), pool.load(2)};
  CHECK(loads == std::multiset<uint64_t>{4, 8, 8});
  // The next step's groups go first to the one with the least outstanding.
  size_t light = pool.load(0) == 4 ? 0 : pool.load(1) == 4 ? 1 : 2;
  auto next = pool.assign(plan_of(1, {"a"}, 4, 100));
  REQUIRE(next.size() == 1);
  CHECK(next[0].first == light);
}

TEST_CASE("stored samples lower the load and close their group") {
  SamplerPool pool(2);
  auto as = pool.assign(plan_of(0, {"a", "b"}, 2, 0));
  REQUIRE(as.size() == 2);
  CHECK(pool.groups_open() == 2);
  const size_t owner_a = as[0].second.task_ids[0] == "a" ? as[0].first : as[1].first;
  pool.arrived("a", 0, 0);
  pool.arrived("a", 0, 0);  // a duplicate counts once
  CHECK(pool.load(owner_a) == 1);
  pool.arrived("a", 0, 1);
  CHECK(pool.load(owner_a) == 0);
  CHECK(pool.groups_open() == 1);
  pool.arrived("zzz", 9, 0);  // not planned: ignored
  CHECK(pool.groups_open() == 1);
}

TEST_CASE("a lost sampler's unfinished groups are planned again from their first missing sample") {
  SamplerPool pool(2);
  auto as = pool.assign(plan_of(3, {"a", "b", "c", "d"}, 4, 10));
  REQUIRE(as.size() == 2);
  const size_t dead = as[0].first, live = as[1].first;
  const SamplePlan& lost_plan = as[0].second;
  REQUIRE(lost_plan.task_ids.size() == 2);
  // Of the dead sampler's first group, samples 0, 1 and 3 are stored; of its second, all four.
  const std::string t0 = lost_plan.task_ids[0], t1 = lost_plan.task_ids[1];
  const uint64_t g0 = lost_plan.group_ids[0], g1 = lost_plan.group_ids[1];
  for (uint32_t k : {0u, 1u, 3u}) pool.arrived(t0, g0, k);
  for (uint32_t k = 0; k < 4; ++k) pool.arrived(t1, g1, k);
  auto again = pool.lost(dead);
  CHECK_FALSE(pool.is_alive(dead));
  REQUIRE(again.size() == 1);
  CHECK(again[0].first == live);
  const SamplePlan& p = again[0].second;
  CHECK(p.step == 3);
  CHECK(p.task_ids == std::vector<std::string>{t0});
  CHECK(p.group_ids == std::vector<uint64_t>{g0});
  CHECK(p.first_index == 2);  // samples 2 and 3: 2 is missing, 3 arrives again as a duplicate
  CHECK(p.n == 2);
  CHECK(ids_of(again) == std::multiset<std::string>{make_sample_id(t0, g0, 2), make_sample_id(t0, g0, 3)});
  // The group closes once its last missing sample is stored, wherever it came from.
  pool.arrived(t0, g0, 3);  // the duplicate: already stored
  CHECK(pool.groups_open() == 3);
  pool.arrived(t0, g0, 2);
  CHECK(pool.groups_open() == 2);  // the live sampler's own two groups
  // Losing the last sampler plans nothing and says so; its groups and new plans wait.
  CHECK(pool.lost(live).empty());
  CHECK(pool.alive() == 0);
  CHECK(pool.waiting() == 2);
  CHECK(pool.assign(plan_of(4, {"a"}, 1, 50)).empty());
  CHECK(pool.waiting() == 3);
  CHECK(pool.adopt().empty());  // still nobody
}

TEST_CASE("a sampler that joins takes the groups that were waiting, and then its share") {
  SamplerPool pool(0);  // a run whose samplers all live on other nodes
  auto none = pool.assign(plan_of(0, {"a", "b"}, 2, 0));
  CHECK(none.empty());
  CHECK(pool.waiting() == 2);
  pool.arrived("a", 0, 0);  // (a sample of a waiting group, e.g. a dead sampler's that was being evaluated)
  const size_t j = pool.add();
  CHECK(j == 0);
  CHECK(pool.alive() == 1);
  auto got = pool.adopt();  // from each group's first missing sample: a#0 is not asked for again
  REQUIRE(got.size() == 2);
  CHECK(got[0].first == j);
  CHECK(ids_of(got) ==
        std::multiset<std::string>{make_sample_id("a", 0, 1), make_sample_id("b", 1, 0), make_sample_id("b", 1, 1)});
  CHECK(pool.waiting() == 0);
  CHECK(pool.load(j) == 3);     // the three samples not yet stored
  CHECK(pool.adopt().empty());  // nothing waits any more
  // A second sampler joins: the next step's groups go to it first (it has no load).
  const size_t k = pool.add();
  auto next = pool.assign(plan_of(1, {"c"}, 2, 10));
  REQUIRE(next.size() == 1);
  CHECK(next[0].first == k);
  // The first one goes: its groups move to the newcomer, from their first missing sample.
  auto moved = pool.lost(j);
  REQUIRE(moved.size() == 2);
  CHECK(moved[0].first == k);
  CHECK(ids_of(moved) ==
        std::multiset<std::string>{make_sample_id("a", 0, 1), make_sample_id("b", 1, 0), make_sample_id("b", 1, 1)});
}

TEST_CASE("every sample of a step is asked for exactly once across the samplers") {
  SamplerPool pool(4);
  auto as = pool.assign(plan_of(0, {"a", "b", "c", "d", "e", "f", "g"}, 3, 0));
  auto ids = ids_of(as);
  CHECK(ids.size() == 21);
  CHECK(std::set<std::string>(ids.begin(), ids.end()).size() == 21);
}

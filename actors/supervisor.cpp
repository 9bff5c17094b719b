#include "actors/supervisor.hpp"

#include "core/log.hpp"
#include "core/paths.hpp"
#include "store/store.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>

namespace kernelrl {

namespace {

struct TaskAgg {
  uint64_t samples = 0, correct = 0, faster = 0;
  double speedup_sum = 0, reward_sum = 0;
};

struct supervisor_state {
  std::unique_ptr<Store> store;
  caf::response_promise done;
  bool planned = false, finished = false;
  uint64_t expected = 0, recorded = 0, duplicates = 0, store_failures = 0;
  std::map<std::string, uint64_t> status_counts;
  std::map<std::string, TaskAgg> tasks;
  size_t evaluators_alive = 0;
  uint64_t waits = 0;  // join deadlines started (a deadline only counts if it is the latest)
  double t_start = 0;
  double t_first_record = -1, t_last_record = -1;  // mono_s of the first and last stored sample
  std::vector<double> speedups;              // of correct samples (the speedup distribution)
  std::vector<uint64_t> reward_hist;         // counts per reward_edges bin
  uint32_t step = 0;                         // latest step a recorded sample belongs to
  uint64_t policy_version = 0;               // newest policy version seen in a sample
  uint64_t stale_max = 0, stale_sum = 0;     // policy_version - sample's version, at record time
  static inline const char* name = "supervisor";
};

using self_ptr = caf::stateful_actor<supervisor_state>*;

// Reward histogram bins: (-inf, 0], (0, 0.5], (0.5, 1], (1, 1.5], (1.5, 2], (2, 5], (5, inf).
const std::vector<double> reward_edges = {0, 0.5, 1, 1.5, 2, 5};
const std::vector<std::string>& reward_bins = reward_histogram_bins();

size_t reward_bin(double r) {
  size_t i = 0;
  while (i < reward_edges.size() && r > reward_edges[i]) ++i;
  return i;
}

// The q-quantile (0..1, nearest rank) of xs; xs is reordered.
double quantile(std::vector<double>& xs, double q) {
  if (xs.empty()) return 0;
  size_t k = std::min(xs.size() - 1, static_cast<size_t>(q * double(xs.size() - 1) + 0.5));
  std::nth_element(xs.begin(), xs.begin() + k, xs.end());
  return xs[k];
}

StepStats step_stats(const supervisor_state& st, uint32_t step) {
  StepStats s;
  s.step = step;
  uint64_t faster = 0;
  double speedup_sum = 0, reward_sum = 0;
  for (auto& [id, t] : st.tasks) {
    s.samples += t.samples;
    s.correct += t.correct;
    faster += t.faster;
    speedup_sum += t.speedup_sum;
    reward_sum += t.reward_sum;
  }
  s.fast_1 = s.samples ? double(faster) / double(s.samples) : 0.0;
  s.mean_speedup = s.correct ? speedup_sum / double(s.correct) : 0.0;
  s.mean_reward = s.samples ? reward_sum / double(s.samples) : 0.0;
  s.status_counts = st.status_counts;
  return s;
}

void finish(self_ptr self, const SupervisorArgs& args, const std::string& error) {
  auto& st = self->state;
  if (st.finished) return;
  st.finished = true;
  auto lg = log::get("supervisor");
  StepStats s = step_stats(st, 0);
  nlohmann::json j;
  j["run_id"] = args.run_id;
  j["mode"] = args.mode;
  j["ok"] = error.empty();
  j["error"] = error;
  j["expected"] = st.expected;
  j["samples"] = s.samples;
  j["correct"] = s.correct;
  j["fast_1"] = s.fast_1;
  j["mean_speedup"] = s.mean_speedup;
  j["mean_reward"] = s.mean_reward;
  j["status_counts"] = s.status_counts;
  j["duplicates_dropped"] = st.duplicates;
  j["store_failures"] = st.store_failures;
  j["wall_s"] = mono_s() - st.t_start;
  // From the first sample stored to the last: the pipeline's pace once work flows.
  j["record_span_s"] = st.t_first_record < 0 ? 0.0 : st.t_last_record - st.t_first_record;
  nlohmann::json tasks = nlohmann::json::array();
  for (auto& id : args.task_ids) {
    auto it = st.tasks.find(id);
    TaskAgg t = it == st.tasks.end() ? TaskAgg{} : it->second;
    tasks.push_back({{"task_id", id},
                     {"samples", t.samples},
                     {"correct", t.correct},
                     {"fast_1", t.samples ? double(t.faster) / double(t.samples) : 0.0},
                     {"mean_speedup", t.correct ? t.speedup_sum / double(t.correct) : 0.0}});
  }
  for (auto& [id, t] : st.tasks) {  // samples of tasks outside the task set (failed lookups)
    bool known = false;
    for (auto& k : args.task_ids) known = known || k == id;
    if (!known)
      tasks.push_back({{"task_id", id}, {"samples", t.samples}, {"correct", t.correct},
                       {"fast_1", 0.0}, {"mean_speedup", 0.0}});
  }
  j["tasks"] = tasks;
  if (st.store) {
    if (s.samples > 0 && !st.store->record_step(args.run_id, s))
      lg->error("store: cannot record step 0: {}", st.store->last_error());
    if (!st.store->finish_run(args.run_id, error.empty() ? "completed" : "failed", j.dump()))
      lg->error("store: cannot finish run: {}", st.store->last_error());
  }
  if (error.empty())
    lg->info("run {} complete: {} samples, {} correct", args.run_id, s.samples, s.correct);
  else
    lg->error("run {} failed: {}", args.run_id, error);
  if (st.done.pending()) st.done.deliver(j.dump());
}

caf::behavior supervisor_actor(self_ptr self, SupervisorArgs args) {
  auto lg = log::get("supervisor");
  std::string err;
  self->state.store = Store::open(args.store_path, args.synchronous, err);
  if (!self->state.store) {
    lg->error("{}", err);
  } else if (!self->state.store->begin_run(args.run_id, args.mode, args.config_toml)) {
    lg->error("store: cannot begin run: {}", self->state.store->last_error());
  }
  // No evaluator running: a single node fails at once; a cluster waits join_wait_s for one to
  // join (a node restarting, a new machine) before it gives up.
  auto none_left = [=](const std::string& why) {
    auto& st = self->state;
    if (st.finished || (st.planned && st.recorded >= st.expected)) return;
    if (args.join_wait_s <= 0) {
      finish(self, args, why);
      return;
    }
    uint64_t n = ++st.waits;
    lg->warn("no evaluator is running; waiting up to {:g} s for one to join", args.join_wait_s);
    self->delayed_send(self, std::chrono::milliseconds(static_cast<int64_t>(args.join_wait_s * 1000)),
                       tick_atom::value, n);
  };
  self->set_down_handler([=](caf::down_msg&) {
    auto& st = self->state;
    if (st.evaluators_alive > 0) --st.evaluators_alive;
    if (st.evaluators_alive == 0)
      none_left("no evaluator is running (see the errors above); " +
                std::to_string(st.expected - st.recorded) + " samples have no verdict");
  });
  self->state.t_start = mono_s();
  return {
      [=](plan_atom, caf::actor sampler, std::vector<caf::actor> evaluators) -> caf::response_promise {
        auto& st = self->state;
        st.done = self->make_response_promise();
        st.evaluators_alive = evaluators.size();
        for (auto& e : evaluators) self->monitor(e);
        if (!st.store) {
          finish(self, args, "the run store could not be opened: " + err);
          return st.done;
        }
        if (st.evaluators_alive == 0) {
          none_left("no evaluator is running (see the errors above)");
          if (st.finished) return st.done;
        }
        self->request(sampler, caf::infinite, plan_atom::value, uint32_t{0})
            .then(
                [=](uint64_t n) {
                  auto& st = self->state;
                  st.planned = true;
                  st.expected = n;
                  lg->info("eval: {} samples to evaluate", n);
                  if (st.recorded >= st.expected) finish(self, args, "");
                },
                [=](caf::error& e) { finish(self, args, "sampler failed: " + self->system().render(e)); });
        return st.done;
      },
      [=](register_atom, caf::actor ev, const std::string& id) {  // from the gate: a remote evaluator
        self->monitor(ev);
        ++self->state.evaluators_alive;
        lg->info("evaluator {} joined ({} running)", id, self->state.evaluators_alive);
      },
      [=](tick_atom, uint64_t n) {  // a join deadline
        auto& st = self->state;
        if (n == st.waits && st.evaluators_alive == 0 && !st.finished)
          finish(self, args, "no evaluator joined within " + fmt::format("{:g}", args.join_wait_s) + " s; " +
                                 std::to_string(st.expected - st.recorded) + " samples have no verdict");
      },
      [=](record_atom, ScoredRollout& s) {
        auto& st = self->state;
        switch (st.store->record_sample(args.run_id, s)) {
          case InsertResult::duplicate:
            ++st.duplicates;
            lg->warn("sample {} arrived twice; the second copy is dropped", s.rollout.sample_id);
            return;
          case InsertResult::failed:
            ++st.store_failures;
            lg->error("store: cannot record sample {}: {}", s.rollout.sample_id,
                      st.store->last_error());
            break;
          case InsertResult::inserted: break;
        }
        ++st.recorded;
        st.t_last_record = mono_s();
        if (st.t_first_record < 0) st.t_first_record = st.t_last_record;
        ++st.status_counts[to_string(s.result.status)];
        if (st.reward_hist.empty()) st.reward_hist.assign(reward_bins.size(), 0);
        ++st.reward_hist[reward_bin(s.reward)];
        st.step = std::max(st.step, s.rollout.step);
        st.policy_version = std::max(st.policy_version, s.rollout.policy_version);
        uint64_t stale = st.policy_version - s.rollout.policy_version;
        st.stale_max = std::max(st.stale_max, stale);
        st.stale_sum += stale;
        auto& t = st.tasks[s.rollout.task_id];
        ++t.samples;
        t.reward_sum += s.reward;
        if (s.result.status == EvalStatus::ok) {
          ++t.correct;
          t.speedup_sum += s.result.speedup;
          st.speedups.push_back(s.result.speedup);
          if (s.result.speedup > 1.0) ++t.faster;
        }
        if (st.planned && st.recorded >= st.expected) finish(self, args, "");
      },
      [=](record_atom, Telemetry& t) {
        auto& st = self->state;
        if (st.store && !st.store->record_telemetry(args.run_id, t))
          lg->warn("store: cannot record telemetry: {}", st.store->last_error());
      },
      [=](stats_atom) {
        auto& st = self->state;
        Telemetry t;
        t.ts = now_s();
        t.source = "supervisor";
        StepStats s = step_stats(st, 0);
        double elapsed = mono_s() - st.t_start;
        double rate = elapsed > 0 ? double(st.recorded) / elapsed : 0.0;
        double left = st.expected > st.recorded ? double(st.expected - st.recorded) : 0.0;
        t.values = {{"samples_done", double(st.recorded)},
                    {"samples_total", double(st.expected)},
                    {"correct", double(s.correct)},
                    {"fast_1", s.fast_1},
                    {"mean_reward", s.mean_reward},
                    {"mean_speedup", s.mean_speedup},
                    {"samples_per_s", rate},
                    {"eta_s", rate > 0 ? left / rate : -1.0},
                    {"elapsed_s", elapsed},
                    {"evaluators_alive", double(st.evaluators_alive)},
                    {"step", double(st.step)},
                    {"policy_version", double(st.policy_version)},
                    {"staleness_max", double(st.stale_max)},
                    {"staleness_mean", st.recorded ? double(st.stale_sum) / double(st.recorded) : 0.0},
                    {"correct_rate", st.recorded ? double(s.correct) / double(st.recorded) : 0.0}};
        t.step = st.step;
        for (auto& [k, v] : st.status_counts) t.values["status." + k] = double(v);
        auto xs = st.speedups;
        for (auto [name, q] : std::initializer_list<std::pair<const char*, double>>{
                 {"p10", 0.1}, {"p25", 0.25}, {"p50", 0.5}, {"p75", 0.75}, {"p90", 0.9}, {"max", 1.0}})
          t.values[std::string("speedup.") + name] = quantile(xs, q);
        for (size_t i = 0; i < reward_bins.size(); ++i)
          t.values["reward_hist." + reward_bins[i]] = st.reward_hist.empty() ? 0.0 : double(st.reward_hist[i]);
        return t;
      },
  };
}

}  // namespace

const std::vector<std::string>& reward_histogram_bins() {
  static const std::vector<std::string> bins = {"le_0", "0_0.5", "0.5_1", "1_1.5", "1.5_2", "2_5", "gt_5"};
  return bins;
}

caf::actor spawn_supervisor(caf::actor_system& sys, SupervisorArgs args) {
  return sys.spawn(supervisor_actor, std::move(args));
}

}  // namespace kernelrl

#include "actors/sampler.hpp"

#include "policy/sampler_backend.hpp"
#include "analysis/analysis.hpp"
#include "core/log.hpp"
#include "core/paths.hpp"
#include "store/store.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>

namespace fs = std::filesystem;

namespace kernelrl {

namespace {

void load_jsonl(const std::string& file, std::vector<ReplayRecord>& out, std::vector<std::string>& errors) {
  std::ifstream in(file);
  if (!in) {
    errors.push_back(file + ": cannot open replay file");
    return;
  }
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string where = file + ":" + std::to_string(n);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      errors.push_back(where + ": not valid JSON: " + e.what());
      continue;
    }
    if (!j.is_object()) {
      errors.push_back(where + ": expected a JSON object");
      continue;
    }
    ReplayRecord r;
    r.origin = where;
    try {
      if (!j.contains("task_id") || !j["task_id"].is_string()) {
        errors.push_back(where + ": task_id: expected a string");
        continue;
      }
      if (!j.contains("completion") || !j["completion"].is_string()) {
        errors.push_back(where + ": completion: expected a string");
        continue;
      }
      r.task_id = j["task_id"];
      r.completion = j["completion"];
      if (j.contains("prompt")) r.prompt = j["prompt"].get<std::string>();
      if (j.contains("token_ids")) r.token_ids = j["token_ids"].get<std::vector<int32_t>>();
      if (j.contains("logprobs")) r.logprobs = j["logprobs"].get<std::vector<float>>();
      if (j.contains("policy_version")) r.policy_version = j["policy_version"].get<uint64_t>();
    } catch (const nlohmann::json::exception& e) {
      errors.push_back(where + ": wrong type: " + e.what());
      continue;
    }
    if (!r.token_ids.empty() && r.logprobs.size() != r.token_ids.size()) {
      errors.push_back(where + ": logprobs has " + std::to_string(r.logprobs.size()) + " entries, token_ids has " +
                       std::to_string(r.token_ids.size()));
      continue;
    }
    out.push_back(std::move(r));
  }
}

}  // namespace

std::vector<ReplayRecord> load_replay(const std::string& path, std::vector<std::string>& errors) {
  std::vector<ReplayRecord> out;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    fs::path store = fs::path(path) / "store.sqlite";
    if (fs::exists(store)) {
      std::string err;
      auto s = Store::open_readonly(store.string(), err);
      if (!s) {
        errors.push_back(err);
        return out;
      }
      for (auto& row : s->samples()) {
        const Rollout& r = row.record.rollout;
        out.push_back({r.task_id, r.prompt, r.completion, r.token_ids, r.logprobs, r.policy_version,
                       store.string() + ":" + r.sample_id});
      }
      return out;
    }
    std::vector<std::string> files;
    for (auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".jsonl") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    if (files.empty()) errors.push_back(path + ": no *.jsonl replay files and no store.sqlite");
    for (auto& f : files) load_jsonl(f, out, errors);
    return out;
  }
  load_jsonl(path, out, errors);
  return out;
}

namespace {

struct PendingPrompt {
  uint32_t step;
  uint64_t group;
  size_t prompt;       // index into SamplerArgs::prompts
  uint32_t n;          // samples of it
  std::string split;   // Rollout::split
  uint32_t first = 0;  // sample_index of its first sample
  // A later turn of an episode (turn > 1): one sample, its own prompt, continuing `parent`.
  uint32_t turn = 0;
  std::string parent, text;
  uint32_t text_tokens = 0;
};

struct sampler_state {
  std::deque<Rollout> to_send;                           // planned, not yet handed to the dispatcher
  std::vector<std::pair<Rollout, std::string>> to_skip;  // left out of evaluation (evaluate_top_m), and why
  uint64_t skipped = 0;
  std::deque<PendingPrompt> to_generate;  // model backends: planned, not yet generated
  bool generating = false;                // a tick is on its way
  uint32_t failures = 0;                  // consecutive failed generations (backoff)
  uint64_t batches = 0;
  uint32_t unanswered = 0;  // handed over, the dispatcher's answer not yet back
  uint64_t rollouts = 0, tokens = 0;
  double t_start = -1;  // mono_s of the first plan
  static inline const char* name = "sampler";
};

using sampler_ptr = sampler_actor::stateful_pointer<sampler_state>;

Telemetry sampler_telemetry(sampler_ptr self, const SamplerArgs& args) {
  auto& st = self->state;
  double elapsed = st.t_start < 0 ? 0 : mono_s() - st.t_start;
  Telemetry t;
  t.ts = now_s();
  t.source = args.id;  // "sampler-N": the monitor sums the samplers' gauges
  t.values = {{"rollouts", double(st.rollouts)},
              {"tokens", double(st.tokens)},
              {"tokens_per_s", elapsed > 0 ? double(st.tokens) / elapsed : 0.0},
              {"waiting", double(st.to_send.size())},
              {"skipped", double(st.skipped)},
              {"to_generate", double(st.to_generate.size())}};
  return t;
}

// Hands rollouts to the dispatcher while fewer than `window` of its answers are outstanding; it
// answers only once its queue has room, so a full queue holds the sampler back. (Its answer
// handlers capture the window, not the SamplerArgs: a copy of those, with every replayed action,
// per rollout made a replay of N actions cost O(N^2).)
void feed(sampler_ptr self, uint32_t window, const rollout_sink& dispatcher) {
  auto& st = self->state;
  for (auto& [r, why] : st.to_skip) self->send(dispatcher, skip_atom::value, std::move(r), std::move(why));
  st.to_skip.clear();
  while (!st.to_send.empty() && st.unanswered < window) {
    Rollout r = std::move(st.to_send.front());
    st.to_send.pop_front();
    ++st.unanswered;
    std::string id = r.sample_id;
    self->request(dispatcher, caf::infinite, std::move(r))
        .then(
            [self, window, dispatcher](bool) {
              --self->state.unanswered;
              feed(self, window, dispatcher);
            },
            [self, window, dispatcher, id](caf::error& e) {
              --self->state.unanswered;
              log::get("sampler")->error("sample {}: the dispatcher refused it: {}", id, self->system().render(e));
              feed(self, window, dispatcher);
            });
  }
}

// One group's rollouts, in sample order: all of them to evaluation, or (evaluate_top_m = m below
// the group's size) only the m most surprising, ranked before any of them is evaluated.
void route_group(sampler_state& st, const SamplerArgs& args, std::vector<Rollout>&& group) {
  const uint32_t m = args.evaluate_top_m;
  if (m == 0 || group.size() <= m) {
    for (auto& r : group) st.to_send.push_back(std::move(r));
    return;
  }
  std::vector<double> means;
  for (auto& r : group) means.push_back(mean_logprob(r.logprobs));
  auto order = surprisal_order(means);
  std::vector<bool> keep(group.size(), false);
  for (size_t k = 0; k < m; ++k) keep[order[k]] = true;
  for (size_t i = 0; i < group.size(); ++i) {
    if (keep[i]) {
      st.to_send.push_back(std::move(group[i]));
    } else {
      ++st.skipped;
      st.to_skip.push_back(
          {std::move(group[i]), fmt::format("not evaluated: mean logprob {:.4f} is not among the {} most "
                                            "surprising of the group's {} samples (evaluate_top_m)",
                                            means[i], m, group.size())});
    }
  }
}

// Generates the next batch of planned prompts, turns the samples into Rollouts and hands them on.
// A failed generation is logged and retried after a growing pause (capped at 30 s): nothing
// planned is dropped.
void generate_next(sampler_ptr self, const SamplerArgs& args, const rollout_sink& dispatcher) {
  auto& st = self->state;
  st.generating = false;
  if (st.to_generate.empty()) return;
  auto lg = log::get("sampler");
  // Prompts generated together share n; the seed follows from what is generated (step and first
  // group), so a run resumed from a checkpoint draws what the uninterrupted run would have.
  // Later turns (one sample a prompt of its own) go together whatever their sample index.
  const auto& first = st.to_generate.front();
  const auto together = [&](const PendingPrompt& x) {
    return x.n == first.n && (x.turn > 1 ? first.turn > 1 : first.turn <= 1 && x.first == first.first);
  };
  size_t take = 0;
  while (take < std::min<size_t>(args.batch_prompts, st.to_generate.size()) && together(st.to_generate[take])) ++take;
  std::vector<std::string> prompts;
  for (size_t i = 0; i < take; ++i) {
    const auto& pp = st.to_generate[i];
    prompts.push_back(pp.turn > 1 ? pp.text : args.prompts[pp.prompt].prompt);
  }
  SamplingParams p = args.params;
  p.n = first.n;
  // A group completed after a restart (first > 0) draws new samples, not its stored ones again.
  p.seed = args.params.seed * 1000003 + uint64_t(first.step) * 7919 + first.group + uint64_t(first.first) * 104729 +
           uint64_t(first.turn) * 15485863;
  std::vector<GenSample> out;
  try {
    out = args.backend->generate(prompts, p);
  } catch (const std::exception& e) {
    double wait = std::min(30.0, 0.5 * double(1u << std::min<uint32_t>(st.failures, 6)));
    ++st.failures;
    if (auto* b = dynamic_cast<const BackendError*>(&e); b && b->permanent) {
      const std::string why =
          fmt::format("{}: a generation that cannot fit however often it is tried: {}", args.id, e.what());
      lg->error("{}; this sampler stops and its unfinished work goes to the others", why);
      self->quit(caf::make_error(caf::sec::runtime_error, why));
      return;
    }
    if (args.max_failures > 0 && st.failures >= args.max_failures) {
      const std::string why = fmt::format("{}: {} generations failed in a row ([sampler] max_failures), the last: {}",
                                          args.id, st.failures, e.what());
      lg->error("{}; this sampler stops and its unfinished work goes to the others", why);
      self->quit(caf::make_error(caf::sec::runtime_error, why));
      return;
    }
    lg->error("generation of {} prompts failed ({} in a row): {}; retrying in {:.1f} s", take, st.failures, e.what(),
              wait);
    st.generating = true;
    self->delayed_send(self, std::chrono::milliseconds(static_cast<int64_t>(wait * 1000)), tick_atom::value);
    return;
  }
  st.failures = 0;
  ++st.batches;
  for (size_t i = 0; i < take; ++i) {
    PendingPrompt pp = st.to_generate.front();
    st.to_generate.pop_front();
    const auto& tp = args.prompts[pp.prompt];
    std::vector<Rollout> group;
    for (uint32_t j = 0; j < p.n; ++j) {
      GenSample& g = out[i * p.n + j];
      Rollout r;
      r.task_id = tp.task_id;
      r.group_id = pp.group;
      r.sample_index = pp.first + j;
      r.step = pp.step;
      r.split = pp.split;
      r.sample_id = make_sample_id(r.task_id, r.group_id, r.sample_index);
      r.prompt = pp.turn > 1 ? pp.text : tp.prompt;
      r.prompt_tokens = pp.turn > 1 ? pp.text_tokens : tp.prompt_tokens;
      r.turn = pp.turn;
      r.parent_id = pp.parent;
      r.completion = std::move(g.text);
      if (auto it = args.bench_actions.find(r.task_id); it != args.bench_actions.end() && !it->second.empty())
        r.completion = it->second[(r.group_id + r.sample_index) % it->second.size()];
      r.token_ids = std::move(g.token_ids);
      r.logprobs = std::move(g.logprobs);
      r.policy_version = g.policy_version;
      r.sampler_id = args.id;
      st.tokens += r.logprobs.size();
      ++st.rollouts;
      group.push_back(std::move(r));
    }
    route_group(st, args, std::move(group));
  }
  feed(self, args.window, dispatcher);
  if (!st.to_generate.empty()) {  // let answers and weight updates in before the next batch
    st.generating = true;
    self->send(self, tick_atom::value);
  }
}

// Queues the plan's prompts for generation; the number of rollouts it will send, or 0 and `err`
// when a task of the plan has no prompt here.
uint64_t enqueue_plan(sampler_ptr self, const SamplerArgs& args, const SamplePlan& plan, std::string& err) {
  auto& st = self->state;
  if (plan.task_ids.size() != plan.group_ids.size()) {
    err = "plan for step " + std::to_string(plan.step) + " has " + std::to_string(plan.task_ids.size()) +
          " tasks but " + std::to_string(plan.group_ids.size()) + " group ids";
    return 0;
  }
  std::vector<PendingPrompt> add;
  const uint32_t n_each = std::max<uint32_t>(1, plan.n);
  if (plan.turn > 1 && (plan.task_ids.size() != 1 || plan.history.size() != n_each)) {
    err = fmt::format(
        "plan for turn {} of step {} has {} groups and {} histories for {} samples (expected one group "
        "and a history a sample)",
        plan.turn, plan.step, plan.task_ids.size(), plan.history.size(), n_each);
    return 0;
  }
  if (plan.turn > 1 && !args.render_turn) {
    err = "this sampler renders no later turns (its launch gave it no turn template)";
    return 0;
  }
  for (size_t i = 0; i < plan.task_ids.size(); ++i) {
    size_t k = 0;
    while (k < args.prompts.size() && args.prompts[k].task_id != plan.task_ids[i]) ++k;
    if (k == args.prompts.size()) {
      err = "task " + plan.task_ids[i] + " of step " + std::to_string(plan.step) + " has no prompt at this sampler";
      return 0;
    }
    if (plan.turn <= 1) {
      add.push_back({plan.step, plan.group_ids[i], k, n_each, plan.split, plan.first_index, plan.turn, "", "", 0});
      continue;
    }
    for (uint32_t j = 0; j < n_each; ++j) {  // episode first_index + j: its own prompt
      const auto& h = plan.history[j];
      if (h.empty()) {
        err = fmt::format("plan for turn {} of step {}: sample {} has no earlier attempt", plan.turn, plan.step,
                          plan.first_index + j);
        return 0;
      }
      auto t = args.render_turn(args.prompts[k].user, h);
      add.push_back({plan.step, plan.group_ids[i], k, 1, plan.split, plan.first_index + j, plan.turn,
                     h.back().sample_id, std::move(t.prompt), t.tokens});
    }
  }
  if (st.t_start < 0) st.t_start = mono_s();
  for (auto& a : add) st.to_generate.push_back(a);
  uint64_t n = 0;
  for (auto& a : add) n += a.n;
  log::get("sampler")->info("{}: {} {}{}: sampling {} completions over {} tasks ({} backend, policy version {})",
                            args.id, plan.split.empty() ? "step" : plan.split + " of version", plan.step,
                            plan.turn > 1 ? fmt::format(" turn {}", plan.turn) : std::string(), n, plan.task_ids.size(),
                            args.backend->name(), args.backend->version());
  if (!st.generating && !st.to_generate.empty()) {
    st.generating = true;
    self->send(self, tick_atom::value);
  }
  return n;
}

sampler_actor::behavior_type sampler_behavior(sampler_ptr self, SamplerArgs args, rollout_sink dispatcher) {
  auto lg = log::get("sampler");
  if (args.backend) {
    return {
        [=](plan_atom, uint32_t step) -> uint64_t {  // every task once, groups numbered by task
          SamplePlan plan;
          plan.step = step;
          plan.n = std::max<uint32_t>(1, args.samples_per_task);
          for (size_t g = 0; g < args.prompts.size(); ++g) {
            plan.task_ids.push_back(args.prompts[g].task_id);
            plan.group_ids.push_back(g);
          }
          std::string err;
          uint64_t n = enqueue_plan(self, args, plan, err);
          return n;
        },
        [=](SamplePlan& plan) -> caf::result<uint64_t> {
          std::string err;
          uint64_t n = enqueue_plan(self, args, plan, err);
          if (!err.empty()) return caf::make_error(caf::sec::runtime_error, "sampler " + args.id + ": " + err);
          return n;
        },
        [=](tick_atom) { generate_next(self, args, dispatcher); },
        [=](WeightsUpdate& u) -> caf::result<uint64_t> {
          const std::string sum = weights_checksum(u.tensors);
          if (sum != u.checksum) {
            lg->error("{}: weights update {}: its tensors do not match its checksum; not applied", args.id, u.version);
            return caf::make_error(caf::sec::runtime_error,
                                   fmt::format("sampler {}: weights update {}: the tensors' SHA-256 is {}, the update "
                                               "says \"{}\" (damaged or incomplete in transit); not applied",
                                               args.id, u.version, sum, u.checksum));
          }
          try {
            args.backend->apply_weights(u);
          } catch (const std::exception& e) {
            lg->error("weights update {}: {}", u.version, e.what());
            return caf::make_error(caf::sec::runtime_error, std::string("sampler ") + args.id + ": " + e.what());
          }
          lg->info("{}: now serving policy version {}", args.id, u.version);
          return u.version;
        },
        [=](stats_atom) { return sampler_telemetry(self, args); },
    };
  }
  return {
      [=](WeightsUpdate& u) -> caf::result<uint64_t> {
        return caf::make_error(caf::sec::runtime_error, "sampler " + args.id +
                                                            ": the replay backend serves recorded "
                                                            "actions and cannot take weights update " +
                                                            std::to_string(u.version));
      },
      [=](SamplePlan& plan) -> caf::result<uint64_t> {
        return caf::make_error(
            caf::sec::runtime_error,
            fmt::format("sampler {}: the replay backend replays every recorded action at once "
                        "and cannot take a plan of {} group{} for step {}",
                        args.id, plan.task_ids.size(), plan.task_ids.size() == 1 ? "" : "s", plan.step));
      },
      [=](tick_atom) {},  // (model backends' timer)
      [=](plan_atom, uint32_t step) -> uint64_t {
        // Groups are tasks in order of first appearance; samples keep their file order.
        std::map<std::string, uint64_t> group_of;
        std::map<std::string, uint32_t> count_of;
        std::map<uint64_t, std::vector<Rollout>> groups;
        uint64_t sent = 0;
        if (self->state.t_start < 0) self->state.t_start = mono_s();
        for (const auto& rec : args.records) {
          uint32_t& n = count_of[rec.task_id];
          if (args.samples_per_task > 0 && n >= args.samples_per_task) continue;
          auto g = group_of.emplace(rec.task_id, group_of.size()).first->second;
          Rollout r;
          r.task_id = rec.task_id;
          r.group_id = g;
          r.sample_index = n++;
          r.step = step;
          r.sample_id = make_sample_id(r.task_id, r.group_id, r.sample_index);
          r.prompt = rec.prompt;
          r.completion = rec.completion;
          r.token_ids = rec.token_ids;
          r.logprobs = rec.logprobs;
          r.policy_version = rec.policy_version;
          r.sampler_id = args.id;
          self->state.tokens += r.token_ids.size();
          if (args.evaluate_top_m > 0)
            groups[g].push_back(std::move(r));  // ranked once the group is whole
          else
            self->state.to_send.push_back(std::move(r));
          ++sent;
        }
        for (auto& [g, rs] : groups) route_group(self->state, args, std::move(rs));
        lg->info("step {}: replayed {} actions over {} tasks", step, sent, group_of.size());
        self->state.rollouts += sent;
        feed(self, args.window, dispatcher);
        return sent;
      },
      [=](stats_atom) { return sampler_telemetry(self, args); },
  };
}

}  // namespace

sampler_actor spawn_sampler(caf::actor_system& sys, SamplerArgs args, rollout_sink dispatcher) {
  if (args.backend)  // generation blocks: a thread of its own, off CAF's scheduler
    return sys.spawn<caf::detached>(sampler_behavior, std::move(args), std::move(dispatcher));
  return sys.spawn(sampler_behavior, std::move(args), std::move(dispatcher));
}

}  // namespace kernelrl

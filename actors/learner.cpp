#include "actors/learner.hpp"

#include "core/log.hpp"
#include "core/paths.hpp"
#include "learner/lora_learner.hpp"
#include "messages/messages.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace fs = std::filesystem;

namespace kernelrl {

namespace {

struct StepPlan {
  uint64_t groups = 0;             // groups the supervisor planned
  uint64_t learned = 0;            // groups learned from (including skipped ones)
  uint64_t skipped = 0;            // groups with equal rewards
  uint64_t teacher_tokens = 0;     // sdpo: tokens the teacher read
  uint64_t teacher_samples = 0;    // sdpo: samples with a teacher signal
  uint64_t coverage_rejected = 0;  // samples profiling rejection sampling took out of their groups
  // The supervisor's (plan_atom, step, groups), answered with the step's update.
  caf::typed_response_promise<StepUpdate> rp;
};

// One WeightsUpdate on its way to some samplers: answered once every one of them has
// acknowledged it or gone away.
struct Publication {
  uint64_t version = 0;
  std::vector<caf::actor_addr> waiting;
  std::function<void(std::string)> done;
  bool over = false;
  bool join = false;  // to one sampler that joined: its going away is this publication's failure
};

struct learner_state {
  std::vector<sampler_actor> samplers;           // every sampler serving the policy (from sync), watched
  std::map<caf::actor_addr, std::string> names;  // each sampler's name for the log
  std::vector<std::shared_ptr<Publication>> publishing;
  uint32_t current = 0;  // the step whose groups are being learned from
  bool started = false;  // `current` is set (by the first plan)
  std::map<uint32_t, StepPlan> steps;
  std::map<std::pair<uint32_t, uint64_t>, std::vector<ScoredRollout>> groups;  // (step, group) -> samples
  std::set<std::pair<uint32_t, uint64_t>> complete;  // groups whose last sample came (the supervisor says which)
  uint64_t received = 0, groups_learned = 0, groups_skipped = 0, updates = 0, sync_failures = 0;
  double last_loss = 0, last_grad_norm = 0, last_entropy = 0, last_clip = 0, last_lr = 0, busy_s = 0;
  static inline const char* name = "learner";
};

using self_ptr = learner_actor::stateful_pointer<learner_state>;

std::string name_of(self_ptr self, const caf::actor_addr& a) {
  auto it = self->state.names.find(a);
  return it == self->state.names.end() ? std::string("a sampler") : it->second;
}

// Starts serving `s` as `name` (watched: when it goes away, it is dropped from every publication).
void add_sampler(self_ptr self, const sampler_actor& s, const std::string& name) {
  auto& st = self->state;
  if (std::find(st.samplers.begin(), st.samplers.end(), s) == st.samplers.end()) {
    st.samplers.push_back(s);
    self->monitor(s);
  }
  st.names[s.address()] = name;
}

void settle(self_ptr self, Publication& p, std::string err) {
  if (p.over) return;
  p.over = true;
  auto& v = self->state.publishing;
  v.erase(std::remove_if(v.begin(), v.end(), [&](auto& q) { return q.get() == &p; }), v.end());
  p.done(std::move(err));
}

bool waits_for(const Publication& p, const caf::actor_addr& a) {
  return std::find(p.waiting.begin(), p.waiting.end(), a) != p.waiting.end();
}

// Sampler `a` is no longer served: it went away (its actor ended, or its node dropped), or it
// refused the weights it joined with. It leaves the set and every publication on its way; the
// others carry on.
void drop_sampler(self_ptr self, const caf::actor_addr& a, const std::string& why) {
  auto& st = self->state;
  const auto before = st.samplers.size();
  st.samplers.erase(std::remove_if(st.samplers.begin(), st.samplers.end(), [&](auto& s) { return s.address() == a; }),
                    st.samplers.end());
  bool waited = false;
  for (auto p : std::vector<std::shared_ptr<Publication>>(st.publishing)) {
    if (!waits_for(*p, a)) continue;
    p->waiting.erase(std::remove(p->waiting.begin(), p->waiting.end(), a), p->waiting.end());
    waited = true;
    if (p->join) {  // it never took the version it joined with
      settle(self, *p, fmt::format("{} {} before it took policy version {}", name_of(self, a), why, p->version));
      continue;
    }
    log::get("learner")->warn("{} {}; policy version {} goes to the {} left", name_of(self, a), why, p->version,
                              st.samplers.size());
    // None left: the version is saved all the same, and a sampler that joins later starts from
    // it (the supervisor decides whether the run can wait for one).
    if (p->waiting.empty()) settle(self, *p, "");
  }
  if (st.samplers.size() == before) return;
  self->demonitor(a);
  if (!waited)
    log::get("learner")->warn("{} {}; the next policy version goes to the {} left", name_of(self, a), why,
                              st.samplers.size());
  if (st.samplers.empty()) log::get("learner")->warn("no sampler is left to publish to");
}

void sampler_gone(self_ptr self, const caf::actor_addr& a) { drop_sampler(self, a, "is gone"); }

// Publishes the engine's weights as `version` to `targets` (every sampler, or one that joined);
// done("") once all have acknowledged it (a sampler that goes away is dropped from the set, not
// waited for), or done(why) on the first that refused it, acknowledged another version or did not
// answer within sync_timeout_s.
// Returns the bytes of tensor data each sampler is sent (0 when there is none to send to).
size_t publish(self_ptr self, const LearnerArgs& args, uint64_t version, std::function<void(std::string)> done,
               std::vector<sampler_actor> targets, bool join = false) {
  if (targets.empty()) {
    done("");
    return 0;
  }
  const WeightsUpdate u = make_weights_update(version, args.engine->adapter_blobs());
  size_t bytes = 0;
  for (auto& t : u.tensors) bytes += t.data.size();
  auto p = std::make_shared<Publication>();
  p->version = version;
  p->done = std::move(done);
  p->join = join;
  for (auto& t : targets) p->waiting.push_back(t.address());
  self->state.publishing.push_back(p);
  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(args.sync_timeout_s * 1000));
  for (auto& target : targets) {
    const caf::actor_addr a = target.address();
    self->request(target, timeout, u)
        .then(
            [=](uint64_t acked) {
              if (p->over || !waits_for(*p, a)) return;  // (an answer from one already dropped)
              if (acked != version) {
                settle(
                    self, *p,
                    fmt::format("{} acknowledged policy version {} instead of {}", name_of(self, a), acked, version));
                return;
              }
              p->waiting.erase(std::remove(p->waiting.begin(), p->waiting.end(), a), p->waiting.end());
              if (p->waiting.empty()) settle(self, *p, "");
            },
            [=](caf::error& e) {
              if (p->over || !waits_for(*p, a)) return;
              if (e == caf::sec::request_receiver_down) {  // gone before it answered
                sampler_gone(self, a);
                return;
              }
              ++self->state.sync_failures;
              std::string why =
                  e == caf::sec::request_timeout
                      ? fmt::format("no acknowledgement within {:g} s ([learner] sync_timeout_s)", args.sync_timeout_s)
                      : error_text(self->system(), e);
              settle(self, *p, fmt::format("{} did not take policy version {}: {}", name_of(self, a), version, why));
            });
  }
  return bytes;
}

void try_step(self_ptr self, const LearnerArgs& args);

// SDPO audit: one JSONL line per sample with its teacher section and what the teacher made of it.
void write_teacher_log(const LearnerArgs& args, StepPlan& plan, const std::vector<ScoredRollout>& group,
                       const std::vector<LearnSample>& samples, const GroupOutcome& out) {
  std::ofstream log;
  if (!args.teacher_log.empty()) log.open(args.teacher_log, std::ios::app);
  for (size_t i = 0; i < group.size(); ++i) {
    const uint64_t tokens = i < out.teacher_tokens.size() ? out.teacher_tokens[i] : 0;
    plan.teacher_tokens += tokens;
    if (tokens > 0) ++plan.teacher_samples;
    if (!log) continue;
    const size_t n = group[i].rollout.token_ids.size();
    nlohmann::json j = {{"sample_id", group[i].rollout.sample_id},
                        {"step", group[i].rollout.step},
                        {"policy_version", group[i].rollout.policy_version},
                        {"teacher_prompt", samples[i].teacher_prompt},
                        {"teacher_tokens", tokens},
                        {"completion_tokens", n}};
    if (tokens > 0) {
      j["teacher_logprob_sum"] = out.teacher_logprob_sum[i];
      j["student_logprob_sum"] = out.student_logprob_sum[i];
      j["advantage_mean"] = args.sdpo.beta * (out.teacher_logprob_sum[i] - out.student_logprob_sum[i]) / double(n);
    }
    log << j.dump() << "\n";
  }
}

}  // namespace

bool rejected_for_coverage(const ScoredRollout& s, double below, double keep_probability, uint64_t seed) {
  if (below <= 0 || (s.result.status != EvalStatus::ok && s.result.status != EvalStatus::unconfirmed) ||
      s.result.kernel_coverage < 0 || s.result.kernel_coverage >= below)
    return false;
  if (keep_probability <= 0) return true;
  // A draw fixed by the sample: the same sample is kept or rejected in every replay of the run.
  uint64_t h = seed ^ 0x9E3779B97F4A7C15ull;
  for (unsigned char c : s.rollout.sample_id) h = (h ^ c) * 0x100000001B3ull;
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  return double(h >> 11) * (1.0 / 9007199254740992.0) >= keep_probability;
}

namespace {

// Learns from every complete group of the current step that is waiting, then steps if the
// step's groups are all in.
void learn_ready(self_ptr self, const LearnerArgs& args) {
  auto& st = self->state;
  auto lg = log::get("learner");
  auto it = st.steps.find(st.current);
  if (it == st.steps.end()) return;
  for (auto g = st.groups.lower_bound({st.current, 0}); g != st.groups.end() && g->first.first == st.current;) {
    if (!st.complete.count(g->first)) {
      ++g;
      continue;
    }
    if (args.reject_coverage_below > 0) {  // profiling rejection sampling: lazy correct samples leave the group
      const size_t before = g->second.size();
      std::erase_if(g->second, [&](const ScoredRollout& s) {
        return rejected_for_coverage(s, args.reject_coverage_below, args.reject_keep_probability, args.reject_seed);
      });
      it->second.coverage_rejected += before - g->second.size();
      if (g->second.size() < 2) {  // nothing left to compare within the group
        lg->info("step {} group {}: {} of its {} samples rejected for kernel coverage below {}; the group is skipped",
                 st.current, g->first.second, before - g->second.size(), before, args.reject_coverage_below);
        ++it->second.skipped;
        ++st.groups_skipped;
        ++it->second.learned;
        ++st.groups_learned;
        st.complete.erase(g->first);
        g = st.groups.erase(g);
        continue;
      }
    }
    std::vector<LearnSample> samples;
    for (auto& s : g->second)
      samples.push_back({s.rollout.prompt, s.rollout.token_ids, s.rollout.logprobs, s.reward, {}, {}});
    std::vector<std::string> sections;
    if (args.sdpo_enabled) {
      sections = teacher_sections(g->second, args.sdpo);
      for (size_t i = 0; i < samples.size(); ++i)
        if (!sections[i].empty())
          samples[i].teacher_prompt = args.teacher_prompt(g->second[i].rollout.task_id, sections[i]);
    }
    double t0 = mono_s();
    try {
      auto out = args.engine->add_group(samples);
      if (out.skipped) {
        ++it->second.skipped;
        ++st.groups_skipped;
      }
      if (args.sdpo_enabled) write_teacher_log(args, it->second, g->second, samples, out);
    } catch (const std::exception& e) {  // a malformed sample: the group is reported and left out
      lg->error("step {} group {} ({}): {}; the group is left out of the update", st.current, g->first.second,
                g->second.front().rollout.task_id, e.what());
      ++it->second.skipped;
    }
    st.busy_s += mono_s() - t0;
    ++it->second.learned;
    ++st.groups_learned;
    st.complete.erase(g->first);
    g = st.groups.erase(g);
  }
  try_step(self, args);
}

void try_step(self_ptr self, const LearnerArgs& args) {
  auto& st = self->state;
  auto lg = log::get("learner");
  auto it = st.steps.find(st.current);
  if (it == st.steps.end() || it->second.groups == 0 || it->second.learned < it->second.groups) return;
  const uint32_t step = st.current;
  StepPlan plan = std::move(it->second);
  st.steps.erase(it);
  StepUpdate u;
  u.step = step;
  UpdateStats r;
  try {
    r = args.engine->step();
    u.checkpoint = checkpoint_dir(args.checkpoint_dir, r.version);
    args.engine->save_checkpoint(u.checkpoint);
  } catch (const std::exception& e) {
    u.error = e.what();
    lg->error("step {}: {}", step, u.error);
    plan.rp.deliver(u);
    return;
  }
  ++st.updates;
  st.last_loss = r.loss;
  st.last_grad_norm = r.grad_norm;
  st.last_entropy = r.entropy;
  st.last_clip = r.clip_fraction;
  st.last_lr = r.lr;
  u.policy_version = r.version;
  u.stats = {{"loss", r.loss},
             {"grad_norm", r.grad_norm},
             {"lr", r.lr},
             {"tokens", r.tokens},
             {"sequences", r.sequences},
             {"pg", r.pg},
             {"kl", r.kl},
             {"clip_fraction", r.clip_fraction},
             {"ratio_mean", r.ratio_mean},
             {"entropy", r.entropy},
             {"mismatch_tokens", r.mismatch_tokens},
             {"mismatch_sequences", r.mismatch_sequences},
             {"applied", r.applied ? 1.0 : 0.0},
             {"learner_s", r.seconds},
             {"groups", double(plan.groups)},
             {"groups_skipped", double(plan.skipped)}};
  if (args.reject_coverage_below > 0) u.stats["coverage_rejected"] = double(plan.coverage_rejected);
  if (args.sdpo_enabled) {
    u.stats["teacher_tokens"] = double(plan.teacher_tokens);
    u.stats["teacher_samples"] = double(plan.teacher_samples);
  }
  lg->info(
      "step {} -> policy version {}: loss {:.4f}, grad norm {:.3f}, lr {:.3g}, {} groups ({} skipped), "
      "clip {:.3f}, entropy {:.3f}, ratio {:.4f}",
      step, r.version, r.loss, r.grad_norm, r.lr, plan.groups, plan.skipped, r.clip_fraction, r.entropy, r.ratio_mean);
  if (args.selector) {
    Checkpoint c;
    c.step = uint32_t(r.version);
    c.policy_version = r.version;
    c.path = u.checkpoint;
    c.score = -1;  // scored when the samples of that version are in
    self->send(args.selector, c);
  }
  auto rp = plan.rp;
  // The weight sync's figures go with the step: seconds until every sampler acknowledged, and the
  // megabytes each was sent.
  const auto t0 = std::chrono::steady_clock::now();
  auto bytes = std::make_shared<size_t>(0);
  *bytes = publish(
      self, args, r.version,
      [=](std::string err) mutable {
        StepUpdate done = u;
        done.error = err;
        done.stats["weight_sync_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        done.stats["weight_sync_mb"] = double(*bytes) / 1e6;
        if (!err.empty()) lg->error("step {}: {}", step, err);
        rp.deliver(done);
      },
      st.samplers);
  st.current = step + 1;  // the next step's groups may be learned from while samplers sync
  learn_ready(self, args);
}

learner_actor::behavior_type learner_behavior(self_ptr self, LearnerArgs args) {
  auto lg = log::get("learner");
  self->set_down_handler([=](caf::down_msg& dm) { sampler_gone(self, dm.source); });
  if (!args.engine) {
    return {
        [=](train_atom, const ScoredRollout&, bool) { ++self->state.received; },
        [=](sync_atom, const std::vector<caf::actor>&) -> caf::result<uint64_t> {
          return caf::make_error(caf::sec::runtime_error, "learner: no model to train in this run");
        },
        [=](sync_atom, const caf::actor&, const std::string&) -> caf::result<uint64_t> {
          return caf::make_error(caf::sec::runtime_error, "learner: no model to train in this run");
        },
        [=](plan_atom, uint32_t step, uint64_t) -> caf::result<StepUpdate> {
          return caf::make_error(caf::sec::runtime_error,
                                 "learner: no model to train in this run (step " + std::to_string(step) + ")");
        },
        [=](stats_atom) {
          Telemetry t;
          t.ts = now_s();
          t.source = "learner";
          t.values = {{"samples_received", double(self->state.received)}, {"updates", 0.0}};
          return t;
        },
    };
  }
  return {
      [=](sync_atom, std::vector<caf::actor> samplers) -> caf::result<uint64_t> {
        for (size_t i = 0; i < samplers.size(); ++i)
          add_sampler(self, caf::actor_cast<sampler_actor>(samplers[i]), "sampler-" + std::to_string(i));
        auto rp = self->make_response_promise<uint64_t>();
        const uint64_t v = args.engine->version();
        std::string dir = checkpoint_dir(args.checkpoint_dir, v);
        if (!fs::exists(fs::path(dir) / "learner.json")) {
          try {
            args.engine->save_checkpoint(dir);
          } catch (const std::exception& e) {
            return caf::make_error(caf::sec::runtime_error, e.what());
          }
          if (args.selector) self->send(args.selector, Checkpoint{uint32_t(v), v, dir, -1.0});
        }
        publish(
            self, args, v,
            [=](std::string err) mutable {
              if (err.empty()) {
                lg->info("policy version {} published to {} sampler(s)", v, self->state.samplers.size());
                rp.deliver(v);
              } else {
                rp.deliver(caf::make_error(caf::sec::runtime_error, err));
              }
            },
            self->state.samplers);
        return rp;
      },
      [=](sync_atom, caf::actor joined, std::string name) -> caf::result<uint64_t> {
        // A sampler that joined: the current weights before it samples, then every later version.
        const auto sampler = caf::actor_cast<sampler_actor>(joined);
        add_sampler(self, sampler, name);
        auto rp = self->make_response_promise<uint64_t>();
        const uint64_t v = args.engine->version();
        publish(
            self, args, v,
            [=](std::string err) mutable {
              if (!err.empty()) {  // not served: no version on its way waits for it
                drop_sampler(self, sampler.address(), "refused the weights it joined with");
                rp.deliver(caf::make_error(caf::sec::runtime_error, err));
                return;
              }
              lg->info("{} joined at policy version {} ({} sampler(s) served)", name, v, self->state.samplers.size());
              rp.deliver(v);
            },
            {sampler}, true);
        return rp;
      },
      [=](plan_atom, uint32_t step, uint64_t groups) -> caf::result<StepUpdate> {
        auto& st = self->state;
        if (!st.started) {
          st.started = true;
          st.current = step;
        }
        if (step < st.current)
          return caf::make_error(caf::sec::runtime_error, fmt::format("learner: step {} is already done", step));
        auto& p = st.steps[step];
        p.groups = groups;
        p.rp = self->make_response_promise<StepUpdate>();
        auto rp = p.rp;
        learn_ready(self, args);
        return rp;
      },
      [=](train_atom, ScoredRollout& s, bool last) {  // `last`: the group is complete
        auto& st = self->state;
        ++st.received;
        const std::pair<uint32_t, uint64_t> key{s.rollout.step, s.rollout.group_id};
        st.groups[key].push_back(std::move(s));
        if (last) {
          st.complete.insert(key);
          learn_ready(self, args);
        }
      },
      [=](stats_atom) {
        auto& st = self->state;
        Telemetry t;
        t.ts = now_s();
        t.source = "learner";
        t.step = st.current;
        t.values = {{"samples_received", double(st.received)},
                    {"updates", double(st.updates)},
                    {"groups_learned", double(st.groups_learned)},
                    {"groups_skipped", double(st.groups_skipped)},
                    {"policy_version", double(args.engine->version())},
                    {"loss", st.last_loss},
                    {"grad_norm", st.last_grad_norm},
                    {"entropy", st.last_entropy},
                    {"clip_fraction", st.last_clip},
                    {"lr", st.last_lr},
                    {"busy_s", st.busy_s},
                    {"sync_failures", double(st.sync_failures)}};
        return t;
      },
  };
}

}  // namespace

learner_actor spawn_learner(caf::actor_system& sys, LearnerArgs args) {
  if (args.engine) return sys.spawn<caf::detached>(learner_behavior, std::move(args));
  return sys.spawn(learner_behavior, std::move(args));
}

}  // namespace kernelrl

#include "actors/learner.hpp"

#include "core/log.hpp"
#include "core/paths.hpp"
#include "learner/lora_learner.hpp"
#include "messages/messages.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

namespace fs = std::filesystem;

namespace kernelrl {

namespace {

struct StepPlan {
  uint64_t groups = 0;           // groups the supervisor planned
  uint64_t learned = 0;          // groups learned from (including skipped ones)
  uint64_t skipped = 0;          // groups with equal rewards
  uint64_t teacher_tokens = 0;   // sdpo: tokens the teacher read
  uint64_t teacher_samples = 0;  // sdpo: samples with a teacher signal
  caf::response_promise rp;
};

struct learner_state {
  std::vector<caf::actor> samplers;  // every sampler serving the policy (from sync)
  uint32_t current = 0;              // the step whose groups are being learned from
  bool started = false;              // `current` is set (by the first plan)
  std::map<uint32_t, StepPlan> steps;
  std::map<std::pair<uint32_t, uint64_t>, std::vector<ScoredRollout>> groups;  // (step, group) -> samples
  uint64_t received = 0, groups_learned = 0, groups_skipped = 0, updates = 0, sync_failures = 0;
  double last_loss = 0, last_grad_norm = 0, last_entropy = 0, last_clip = 0, last_lr = 0, busy_s = 0;
  static inline const char* name = "learner";
};

using self_ptr = caf::stateful_actor<learner_state>*;

// Publishes the engine's weights as `version` to every sampler; done("") once all have
// acknowledged it (a sampler that has gone away is dropped from the set, not waited for), or
// done(why) on the first that refused it, acknowledged another version or did not answer within
// sync_timeout_s.
void publish(self_ptr self, const LearnerArgs& args, uint64_t version, std::function<void(std::string)> done) {
  const auto samplers = self->state.samplers;
  if (samplers.empty()) {
    done("");
    return;
  }
  const WeightsUpdate u = make_weights_update(version, args.engine->adapter_blobs());
  auto left = std::make_shared<size_t>(samplers.size());
  auto failed = std::make_shared<bool>(false);
  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(args.sync_timeout_s * 1000));
  for (size_t i = 0; i < samplers.size(); ++i) {
    self->request(samplers[i], timeout, u)
        .then(
            [=](uint64_t acked) {
              if (*failed) return;
              if (acked != version) {
                *failed = true;
                done(fmt::format("sampler {} acknowledged policy version {} instead of {}", i, acked, version));
                return;
              }
              if (--*left == 0) done("");
            },
            [=](caf::error& e) {
              if (*failed) return;
              if (e == caf::sec::request_receiver_down) {  // a sampler that left: the others carry on
                auto& live = self->state.samplers;
                live.erase(std::remove(live.begin(), live.end(), samplers[i]), live.end());
                log::get("learner")->warn("sampler {} is gone; policy version {} goes to the {} left", i, version,
                                          live.size());
                if (--*left == 0) {
                  if (live.empty())
                    done(fmt::format("no sampler is left to take policy version {}", version));
                  else
                    done("");
                }
                return;
              }
              *failed = true;
              ++self->state.sync_failures;
              std::string why =
                  e == caf::sec::request_timeout
                      ? fmt::format("no acknowledgement within {:g} s ([learner] sync_timeout_s)", args.sync_timeout_s)
                      : error_text(self->system(), e);
              done(fmt::format("sampler {} did not take policy version {}: {}", i, version, why));
            });
  }
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

// Learns from every complete group of the current step that is waiting, then steps if the
// step's groups are all in.
void learn_ready(self_ptr self, const LearnerArgs& args) {
  auto& st = self->state;
  auto lg = log::get("learner");
  auto it = st.steps.find(st.current);
  if (it == st.steps.end()) return;
  for (auto g = st.groups.lower_bound({st.current, 0}); g != st.groups.end() && g->first.first == st.current;) {
    if (g->second.size() < args.group_size) {
      ++g;
      continue;
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
             {"applied", r.applied ? 1.0 : 0.0},
             {"learner_s", r.seconds},
             {"groups", double(plan.groups)},
             {"groups_skipped", double(plan.skipped)}};
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
  publish(self, args, r.version, [=](std::string err) mutable {
    StepUpdate done = u;
    done.error = err;
    if (!err.empty()) lg->error("step {}: {}", step, err);
    rp.deliver(done);
  });
  st.current = step + 1;  // the next step's groups may be learned from while samplers sync
  learn_ready(self, args);
}

caf::behavior learner_actor(self_ptr self, LearnerArgs args) {
  auto lg = log::get("learner");
  if (!args.engine) {
    return {
        [=](train_atom, const ScoredRollout&) { ++self->state.received; },
        [=](sync_atom, const std::vector<caf::actor>&) -> caf::result<uint64_t> {
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
        self->state.samplers = std::move(samplers);
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
        publish(self, args, v, [=](std::string err) mutable {
          if (err.empty()) {
            lg->info("policy version {} published to {} sampler(s)", v, self->state.samplers.size());
            rp.deliver(v);
          } else {
            rp.deliver(caf::make_error(caf::sec::runtime_error, err));
          }
        });
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
        p.rp = self->make_response_promise();
        auto rp = p.rp;
        learn_ready(self, args);
        return rp;
      },
      [=](train_atom, ScoredRollout& s) {
        auto& st = self->state;
        ++st.received;
        auto& g = st.groups[{s.rollout.step, s.rollout.group_id}];
        g.push_back(std::move(s));
        if (g.size() == args.group_size) learn_ready(self, args);
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

caf::actor spawn_learner(caf::actor_system& sys, LearnerArgs args) {
  if (args.engine) return sys.spawn<caf::detached>(learner_actor, std::move(args));
  return sys.spawn(learner_actor, std::move(args));
}

}  // namespace kernelrl

#include "actors/evaluator.hpp"

#include "core/log.hpp"
#include "core/paths.hpp"

#include <caf/all.hpp>

#include <deque>

namespace kernelrl {

namespace {

// One worker process behind a detached actor (each call blocks while the candidate runs).
struct stage_state {
  std::unique_ptr<WorkerClient> worker;
  static inline const char* name = "evaluator_stage";
};

// (stats_atom) -> [error, torch version, device name, capability, network, sandbox]
// (eval_atom, req, precompiled, cuda_arch) -> EvalResult
// (compile_atom, req, cuda_arch) -> EvalResult
caf::behavior stage_actor(caf::stateful_actor<stage_state>* self, WorkerOptions opts, EvaluatorConfig settings) {
  self->state.worker = std::make_unique<WorkerClient>(opts);
  return {
      [=](stats_atom) -> std::vector<std::string> {
        auto& w = *self->state.worker;
        std::string err;
        w.ensure_started(err);
        return {err, w.torch_version(), w.device_name(), w.capability(), w.network(), w.sandbox()};
      },
      [=](eval_atom, EvalRequest& req, bool precompiled, std::string& arch) -> EvalResult {
        return self->state.worker->evaluate(req, settings, StageOptions{precompiled, arch});
      },
      [=](compile_atom, EvalRequest& req, std::string& arch) -> EvalResult {
        return self->state.worker->compile(req, settings, StageOptions{false, arch});
      },
  };
}

struct Job {
  EvalRequest req;
  caf::typed_response_promise<EvalResult> rp;
  bool precompiled = false;
  double compile_s = 0;
  bool compile_cached = false;
  std::string compile_log;
  double ready_at = 0;  // when it joined the timing queue
};

struct evaluator_state {
  caf::actor timing;                  // the device stage
  std::vector<caf::actor> compilers;  // the compile stage
  std::vector<bool> compiler_busy;
  std::deque<std::shared_ptr<Job>> compile_queue, timing_queue;
  bool timing_ready = false, timing_busy = false;
  std::string arch;  // the timing device's architecture, for builds
  static inline const char* name = "evaluator";
};

// Registers the evaluator with its dispatcher (dynamically typed, and on a node the head's gate,
// which trusts a register by its sender's node): sent as the evaluator itself, which a typed
// actor's send() to an untyped receiver does not allow.
template <class Self>
void register_with(Self* self, const caf::actor& dispatcher, const std::string& id) {
  if (dispatcher) caf::unsafe_send_as(self, dispatcher, register_atom::value, caf::actor_cast<caf::actor>(self), id);
}

using self_ptr = evaluator_actor::stateful_pointer<evaluator_state>;

void pump(self_ptr self, const EvaluatorArgs& args);

void finish(self_ptr self, const EvaluatorArgs& args, Job& job, EvalResult r) {
  r.evaluator_id = args.id;
  log::get("evaluator")
      ->debug("{} {} -> {}{}{} ({:.2f} s)", args.id, job.req.sample_id, to_string(r.status),
              r.error.empty() ? "" : ": ", r.error, r.wall_s);
  job.rp.deliver(std::move(r));
}

void pump(self_ptr self, const EvaluatorArgs& args) {
  auto& st = self->state;
  // Builds wait for the timing stage's hello: they must target its architecture (st.arch), or
  // the timing stage would not find them in the cache (the key records the arch) and build again.
  for (size_t i = 0; st.timing_ready && i < st.compilers.size() && !st.compile_queue.empty(); ++i) {
    if (st.compiler_busy[i]) continue;
    auto job = st.compile_queue.front();
    st.compile_queue.pop_front();
    st.compiler_busy[i] = true;
    self->request(st.compilers[i], caf::infinite, compile_atom::value, job->req, st.arch)
        .then(
            [=](EvalResult& r) {
              self->state.compiler_busy[i] = false;
              if (r.status == EvalStatus::compile_error) {
                r.compile_s = r.compile_s > 0 ? r.compile_s : r.wall_s;
                finish(self, args, *job, std::move(r));
              } else {
                job->precompiled = r.error.empty();
                job->compile_s = r.compile_s;
                job->compile_cached = r.compile_cached;
                job->compile_log = r.compile_log;
                if (!job->precompiled)  // the timing stage builds it: say why in its log
                  job->compile_log = "[compile stage: " + r.error + "; the timing stage builds it]\n";
                job->ready_at = now_s();
                self->state.timing_queue.push_back(job);
              }
              pump(self, args);
            },
            [=](caf::error& e) {  // the compile stage is an optimisation: time it anyway
              self->state.compiler_busy[i] = false;
              job->compile_log =
                  "[compile stage failed: " + self->system().render(e) + "; the timing stage builds it]\n";
              job->ready_at = now_s();
              self->state.timing_queue.push_back(job);
              pump(self, args);
            });
  }
  if (!st.timing_ready || st.timing_busy || st.timing_queue.empty()) return;
  auto job = st.timing_queue.front();
  st.timing_queue.pop_front();
  st.timing_busy = true;
  double started = now_s();
  self->request(st.timing, caf::infinite, eval_atom::value, job->req, job->precompiled, st.arch)
      .then(
          [=](EvalResult& r) {
            self->state.timing_busy = false;
            r.ready_at = job->ready_at;
            r.device_start = started;
            r.device_end = now_s();
            if (job->precompiled) {
              r.compile_s += job->compile_s;
              r.compile_cached = job->compile_cached;
            } else {
              r.compile_log = job->compile_log + r.compile_log;
            }
            finish(self, args, *job, std::move(r));
            pump(self, args);
          },
          [=](caf::error& e) {
            self->state.timing_busy = false;
            EvalResult r;
            r.sample_id = job->req.sample_id;
            r.task_id = job->req.task_id;
            r.status = EvalStatus::runtime_error;
            r.error = "evaluator stage failed: " + self->system().render(e);
            r.ready_at = job->ready_at;
            r.device_start = started;
            r.device_end = now_s();
            finish(self, args, *job, std::move(r));
            pump(self, args);
          });
}

evaluator_actor::behavior_type evaluator_behavior(self_ptr self, EvaluatorArgs args, caf::actor dispatcher) {
  auto lg = log::get("evaluator");
  auto& st = self->state;
  st.timing = self->spawn<caf::detached + caf::linked>(stage_actor, args.worker, args.settings);
  WorkerOptions copts = args.worker;
  copts.device = "cpu";
  copts.threads = 1;
  if (!copts.log_path.empty()) copts.log_path += ".compile";
  for (uint32_t i = 0; i < args.settings.compile_workers; ++i) {
    st.compilers.push_back(self->spawn<caf::detached + caf::linked>(stage_actor, copts, args.settings));
    // Its worker process starts with the first build it gets (a failure shows up there): runs
    // without kernels to build never pay for it, and it does not slow the timing stage's start.
    st.compiler_busy.push_back(false);
  }
  self->request(st.timing, caf::infinite, stats_atom::value)
      .then(
          [=](std::vector<std::string>& hello) {
            if (!hello.at(0).empty()) {
              lg->error("evaluator {}: {}", args.id, hello[0]);
              self->quit(caf::make_error(caf::sec::runtime_error, "evaluator " + args.id + ": " + hello[0]));
              return;
            }
            self->state.arch = hello.at(3);
            self->state.timing_ready = true;
            lg->info("evaluator {} ready: torch {}, device {}{}, {} compile worker(s), candidate network: {}", args.id,
                     hello[1], hello[2], hello[3].empty() ? "" : " (sm " + hello[3] + ")",
                     args.settings.compile_workers, hello[4]);
            // Whatever the kernel refused (a namespace, the control group, the filter) is said here.
            auto sandbox_log =
                hello.at(5).find("none:") == std::string::npos ? spdlog::level::info : spdlog::level::warn;
            lg->log(sandbox_log, "evaluator {} candidate sandbox: {}", args.id, hello[5]);
            register_with(self, dispatcher, args.id);
            pump(self, args);
          },
          [=](caf::error& e) {
            self->quit(
                caf::make_error(caf::sec::runtime_error, "evaluator " + args.id + ": " + self->system().render(e)));
          });
  return {
      [=](eval_atom, EvalRequest& req) {
        auto job = std::make_shared<Job>();
        job->req = std::move(req);
        job->rp = self->make_response_promise<EvalResult>();
        auto& s = self->state;
        if (!s.compilers.empty() && declares_build(job->req.action)) {
          s.compile_queue.push_back(job);
        } else {
          job->ready_at = now_s();
          s.timing_queue.push_back(job);
        }
        pump(self, args);
        return job->rp;
      },
      [=](withdraw_atom, const std::string& sample_id) {
        auto& s = self->state;
        for (auto* q : {&s.compile_queue, &s.timing_queue}) {
          for (auto it = q->begin(); it != q->end(); ++it) {
            if ((*it)->req.sample_id != sample_id) continue;
            auto job = *it;
            q->erase(it);
            job->rp.deliver(caf::make_error(caf::sec::runtime_error, withdrawn_error));
            return;
          }
        }
      },
  };
}

// The synthetic backend: no worker, no candidate run. It answers one request at a time after
// a fixed latency, like a device that takes that long per candidate, so that benchmarks measure
// the dispatcher, the transport, the reward and the store rather than kernels.
struct synthetic_state {
  std::deque<std::pair<EvalRequest, caf::typed_response_promise<EvalResult>>> queue;
  bool busy = false;
  static inline const char* name = "synthetic_evaluator";
};

// The evaluator's interface and the self-sent end of a request's latency.
using synthetic_actor = evaluator_actor::extend<caf::reacts_to<done_atom, double>>;
using synth_ptr = synthetic_actor::stateful_pointer<synthetic_state>;

EvalResult synthetic_result(const EvaluatorArgs& args, const EvalRequest& req, double started) {
  EvalResult r;
  r.sample_id = req.sample_id;
  r.task_id = req.task_id;
  r.status = EvalStatus::ok;
  r.compile_log = "[synthetic evaluator: the action was not run; this verdict is not a measurement]";
  r.correctness.trials = r.correctness.passed = 1;
  r.runtime.median_ms = r.ref_runtime.median_ms = args.settings.synthetic_latency_ms;
  r.runtime.trials = r.ref_runtime.trials = 1;
  r.speedup = 1.0;
  r.evaluator_id = args.id;
  r.device = "synthetic";
  r.device_start = started;
  r.device_end = now_s();
  r.wall_s = r.device_end - started;
  return r;
}

void synth_next(synth_ptr self, const EvaluatorArgs& args) {
  auto& st = self->state;
  if (st.busy || st.queue.empty()) return;
  auto latency = std::chrono::microseconds(static_cast<int64_t>(args.settings.synthetic_latency_ms * 1000));
  if (latency.count() == 0) {  // instant: answer everything queued now
    while (!st.queue.empty()) {
      auto [req, rp] = std::move(st.queue.front());
      st.queue.pop_front();
      rp.deliver(synthetic_result(args, req, now_s()));
    }
    return;
  }
  st.busy = true;
  self->delayed_send(self, latency, done_atom::value, now_s());
}

synthetic_actor::behavior_type synthetic_behavior(synth_ptr self, EvaluatorArgs args, caf::actor dispatcher) {
  log::get("evaluator")
      ->info("evaluator {} ready: synthetic, {:g} ms per request (verdicts are not measurements)", args.id,
             args.settings.synthetic_latency_ms);
  register_with(self, dispatcher, args.id);
  return {
      [=](eval_atom, EvalRequest& req) {
        auto rp = self->make_response_promise<EvalResult>();
        self->state.queue.emplace_back(std::move(req), rp);
        synth_next(self, args);
        return rp;
      },
      [=](done_atom, double started) {
        auto& st = self->state;
        st.busy = false;
        auto [req, rp] = std::move(st.queue.front());
        st.queue.pop_front();
        rp.deliver(synthetic_result(args, req, started));
        synth_next(self, args);
      },
      [=](withdraw_atom, const std::string& sample_id) {
        auto& q = self->state.queue;
        // The front is running while busy; only requests behind it can be given back.
        for (auto it = q.begin() + (self->state.busy ? 1 : 0); it != q.end(); ++it) {
          if (it->first.sample_id != sample_id) continue;
          auto rp = it->second;
          q.erase(it);
          rp.deliver(caf::make_error(caf::sec::runtime_error, withdrawn_error));
          return;
        }
      },
  };
}

}  // namespace

evaluator_actor spawn_evaluator(caf::actor_system& sys, EvaluatorArgs args, caf::actor dispatcher) {
  if (args.settings.backend == "synthetic")
    return caf::actor_cast<evaluator_actor>(sys.spawn(synthetic_behavior, std::move(args), std::move(dispatcher)));
  return sys.spawn(evaluator_behavior, std::move(args), std::move(dispatcher));
}

}  // namespace kernelrl

// The evaluator's handle on one worker process (gpu/worker.py): starts it, talks to it over a
// ZeroMQ REQ socket with msgpack, enforces the time limit, notices a crash, kills the process
// group on a timeout and starts a fresh worker for the next request. evaluate() never throws:
// every failure is an EvalResult with a status and a one-line error.
#pragma once

#include "core/config.hpp"
#include "messages/messages.hpp"

#include <memory>
#include <string>
#include <vector>
#include <sys/types.h>

namespace kernelrl {

struct WorkerOptions {
  std::string python;              // interpreter (scripts/python)
  std::string script;              // gpu/worker.py
  std::string device = "cpu";      // torch device: cpu or cuda:N
  uint32_t threads = 1;            // intra-op threads on CPU
  std::string log_path;            // the worker's stdout/stderr go here ("" : /dev/null)
  double startup_timeout_s = 120;  // time allowed for start-up (torch import, CUDA init)
  std::string cache_dir;           // build cache ("": the worker's default)
  bool isolate_network = true;     // candidates are confined (namespaces, private file view); false: debugging only
  std::vector<std::string> hide;   // folders and files candidates must not see (the run root and the
                                   // run's folder with their stores, the cluster's secret and keys)
};

// What one request to the worker adds to the evaluator's settings.
struct StageOptions {
  bool precompiled = false;  // the candidate's kernels were built by the compile stage
  std::string cuda_arch;     // TORCH_CUDA_ARCH_LIST for builds ("" : the worker's own GPU)
};

// Whether an action builds native code or Triton kernels (and so goes through the compile stage).
bool declares_build(const std::string& action);

// Kills every worker this process started (and its candidates): a run interrupted by a signal
// stops at once instead of waiting out the evaluations in flight, whose verdicts are then not
// recorded (the supervisor has ended the run).
void stop_all_workers();

class WorkerClient {
 public:
  explicit WorkerClient(WorkerOptions opts);
  ~WorkerClient();
  WorkerClient(const WorkerClient&) = delete;
  WorkerClient& operator=(const WorkerClient&) = delete;

  // Starts the worker if it is not running; false (and `err`) when it cannot start.
  bool ensure_started(std::string& err);
  // Evaluates one request under `settings` (the worker enforces the time limit in the candidate's
  // process; this side allows a grace period and kills the whole worker if it passes).
  EvalResult evaluate(const EvalRequest& req, const EvaluatorConfig& settings, const StageOptions& stage = {});
  // Compile stage: builds the candidate's kernels into the cache, without a GPU. Returns status
  // ok (built, cached, or nothing to build) or compile_error with the log.
  EvalResult compile(const EvalRequest& req, const EvaluatorConfig& settings, const StageOptions& stage = {});
  // Stops the worker (politely, then by force).
  void stop();

  pid_t pid() const { return pid_; }
  uint32_t restarts() const { return starts_ > 0 ? starts_ - 1 : 0; }
  const std::string& torch_version() const { return torch_version_; }
  const std::string& device_name() const { return device_name_; }
  const std::string& capability() const { return capability_; }  // "9.0" on an H100; "" on CPU
  const std::string& network() const { return network_; }        // candidates' network isolation
  const std::string& sandbox() const { return sandbox_; }        // namespaces, files, user, cgroup, seccomp

 private:
  struct Impl;
  // Sends `payload` and waits for the reply until `deadline` (mono seconds). Returns "" and the
  // reply, or an error kind ("timeout", "died: ...", "io: ...").
  std::string round_trip(const std::string& payload, double deadline, std::string& reply);
  void kill_worker();

  WorkerOptions opts_;
  std::unique_ptr<Impl> impl_;
  pid_t pid_ = -1;
  uint32_t starts_ = 0;
  std::string endpoint_;
  std::string worker_dir_;  // the worker's folder: its TMPDIR, and socket/ (0700) with its endpoint
  std::string torch_version_, device_name_, capability_, network_, sandbox_;
  // `alone`: the evaluation holds the device's memory to itself (gpu/devlock.py MemoryShare);
  // `retry_alone`, if given, is set when the worker asks for that (it ran out of memory beside
  // another worker's evaluation).
  EvalResult call(const char* op, const EvalRequest& req, const EvaluatorConfig& settings, const StageOptions& stage,
                  bool alone = false, bool* retry_alone = nullptr);
};

}  // namespace kernelrl

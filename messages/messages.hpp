// Every message of the actor graph: plain structs, their CAF type names and inspect(), their
// msgpack form (MSGPACK_DEFINE_MAP: a map keyed by field name, so readers tolerate added fields),
// and the atoms that tag requests. Nothing else lives here.
//
// One sample's life: Rollout (sampler) -> EvalRequest (dispatcher) -> EvalResult (evaluator)
// -> ScoredRollout (reward) -> store / learner. StepStats, Checkpoint, WeightsUpdate and Telemetry
// carry the experiment's progress. Register all of them once with add_message_types().
#pragma once

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>
#include <msgpack.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kernelrl {

// Bumped whenever a message's fields change; peers with another version are refused.
inline constexpr uint32_t protocol_version = 19;

// ---------------------------------------------------------------------------------------------
// The verdict of one evaluation. Order is part of the wire format: append only.
enum class EvalStatus : uint8_t {
  ok = 0,             // compiled, correct on every trial, timed
  format_error = 1,   // empty action, prose, code that does not parse
  compile_error = 2,  // the assembled program failed to build or import
  runtime_error = 3,  // raised (or crashed the worker) while running
  timeout = 4,        // exceeded the evaluator's time limit
  incorrect = 5,      // ran but disagreed with the reference (shape, dtype, values, NaN/Inf)
  hacked = 6,         // caught gaming the harness
  skipped = 7,        // not evaluated: a selection strategy left it out before evaluation
                      // (best_of_n with evaluate_top_m); kept for audit, never counted as a verdict
  out_of_memory = 8,  // the evaluation itself (the task's inputs and reference at its sizes, the
                      // harness's checks) needed more memory than the device has: no verdict on
                      // the candidate, never counted as one; the error names the peak
  unconfirmed = 9,    // correct on every check and re-verified, but faster than writing its outputs
                      // allows at the device's measured bandwidth, or above [evaluator]
                      // review_speedup when set (`review` says which): a verdict, counted
                      // as correct but not faster until `launch confirm` makes it ok; the reward pays
                      // [reward] unconfirmed_speedup for it
};
std::string to_string(EvalStatus s);
// Parses the names above; false when `name` is none of them.
bool from_string(const std::string& name, EvalStatus& out);
// Whether a status is a verdict on the candidate (false for skipped and out_of_memory: such a
// sample is stored, rewarded 0 and left out of every rate).
bool is_verdict(EvalStatus s);

// ---------------------------------------------------------------------------------------------
// A sample made by a sampler: the policy's action for one task.
struct Rollout {
  std::string sample_id;           // unique within a run: "<task_id>#<group_id>.<sample_index>"
  std::string task_id;             // the task this action answers
  uint64_t group_id = 0;           // samples of one task drawn together (a GRPO group)
  uint32_t sample_index = 0;       // index within the group
  uint32_t step = 0;               // experiment step that asked for it
  std::string prompt;              // the prompt text the policy saw
  std::string completion;          // the policy's raw action text
  std::vector<int32_t> token_ids;  // completion token ids (empty for replay without tokens)
  std::vector<float> logprobs;     // per-token logprobs of token_ids under the sampling policy
  uint64_t policy_version = 0;     // version of the weights that produced it
  std::string sampler_id;          // which sampler made it
  std::string split;               // "": a sample of the experiment; "eval": a train run's periodic
                                   // evaluation on its eval split (never learned from; `step` is
                                   // the policy version it evaluates)
  uint32_t prompt_tokens = 0;      // tokens of `prompt` under the policy's tokenizer (0: unknown)
  // Multi-turn episodes ([experiment] turns): which turn of its episode this is (0: a single-turn
  // sample, else 1..T) and the sample of the turn before, whose action and feedback the prompt
  // shows ("" for a first turn). Sample i of a turn's group continues episode i.
  uint32_t turn = 0;
  std::string parent_id;
  friend bool operator==(const Rollout&, const Rollout&) = default;
  MSGPACK_DEFINE_MAP(sample_id, task_id, group_id, sample_index, step, prompt, completion, token_ids, logprobs,
                     policy_version, sampler_id, split, prompt_tokens, turn, parent_id);
};

// What the dispatcher asks an evaluator to do with one rollout.
struct EvalRequest {
  std::string sample_id;     // Rollout::sample_id
  std::string task_id;       // task to evaluate against
  std::string task_path;     // absolute path of the task's KernelBench .py file
  std::string action;        // the raw action text
  std::string action_space;  // "forward_body" or "full_program"
  std::string mode;          // "fast" or "full" timing protocol
  uint64_t seed = 0;         // base seed for inputs and weights
  uint32_t attempt = 0;      // re-dispatch count (0 on the first try)
  friend bool operator==(const EvalRequest&, const EvalRequest&) = default;
  MSGPACK_DEFINE_MAP(sample_id, task_id, task_path, action, action_space, mode, seed, attempt);
};

// Timing statistics over `trials` measurements, in milliseconds.
struct RuntimeStats {
  double median_ms = 0, mean_ms = 0, std_ms = 0, min_ms = 0, max_ms = 0;
  uint32_t trials = 0;  // 0: not timed
  friend bool operator==(const RuntimeStats&, const RuntimeStats&) = default;
  MSGPACK_DEFINE_MAP(median_ms, mean_ms, std_ms, min_ms, max_ms, trials);
};

// How the candidate's outputs compared with the reference's.
struct Correctness {
  uint32_t trials = 0;        // trials run (including the re-check after timing)
  uint32_t passed = 0;        // trials within tolerance
  double max_abs_diff = 0;    // worst |candidate - reference| over all trials
  double max_rel_diff = 0;    // worst |candidate - reference| / (|reference| + eps)
  double atol = 0, rtol = 0;  // element-wise tolerances applied (on the task's own draw)
  std::string detail;         // first mismatch, e.g. "trial 2 (inputs: ..., seed N): shape [4, 8] != [8, 4]"
  // The scale rule: worst root-mean-square error relative to the reference's root-mean-square
  // value over outputs and trials, the rule's tolerance, and the worst rounding error of the
  // reference itself (against float64) where the rule needed it (0: never).
  double max_scale_err = 0, scale_tol = 0, ref_noise = 0;
  std::string distributions;        // each input distribution beyond the task's own draw: "signed:
                                    // passed; large: outside the reference's domain (...); ..."
  std::string failed_distribution;  // the failing trial's inputs ("task", "signed", ...; "" if none)
  uint64_t failed_seed = 0;         // and their seed
  friend bool operator==(const Correctness&, const Correctness&) = default;
  MSGPACK_DEFINE_MAP(trials, passed, max_abs_diff, max_rel_diff, atol, rtol, detail, max_scale_err, scale_tol,
                     ref_noise, distributions, failed_distribution, failed_seed);
};

// The node of an evaluator's id ("node/device": "n1/cuda:0", "n1/cuda:0#2", "n1/cpu-1" -> "n1").
inline std::string evaluator_node(const std::string& id) { return id.substr(0, id.find('/')); }

// The evaluator's verdict on one EvalRequest.
struct EvalResult {
  std::string sample_id;  // EvalRequest::sample_id
  std::string task_id;    // EvalRequest::task_id
  EvalStatus status = EvalStatus::format_error;
  std::string error;            // one-line reason when status != ok
  std::string assembled_code;   // the full program built from the action (empty on format_error)
  std::string compile_log;      // build/import output of the candidate
  std::string output;           // what the candidate's process printed (stdout and stderr) while it was
                                // evaluated: the first and last 4 KB, with how many bytes were cut
  Correctness correctness;      // comparison with the reference
  RuntimeStats runtime;         // candidate timing
  RuntimeStats ref_runtime;     // reference timing under the same protocol
  double speedup = 0;           // ref_runtime.median / runtime.median; 0 unless ok
  std::string evaluator_id;     // which evaluator produced it ("node/device")
  std::string device;           // device name the timing is for
  double wall_s = 0;            // wall-clock seconds the evaluation took
  double kernel_coverage = -1;  // GPU: time in the candidate's own kernels / all kernel time in
                                // forward (profiler); -1: not measured (CPU, or never reached)
  double compile_s = 0;         // seconds spent building native/CUDA code for this candidate
  bool compile_cached = false;  // every build was found in the content-addressed cache
  bool reverified = false;      // an extreme speedup triggered (and passed) full re-verification
  double isolation_s = 0;       // fork-to-first-instruction time of the candidate's process
  // When (Unix seconds) the evaluator had the candidate ready for its device stage (built, when
  // it builds anything), handed it to the device stage, and got the verdict back; 0: never.
  double ready_at = 0, device_start = 0, device_end = 0;
  uint64_t device_peak_bytes = 0;  // the evaluation's peak device memory (GPU; 0: CPU or unknown)
  std::string review;              // unconfirmed: what awaits confirmation (the threshold, the bound)
  std::string note;                // how the evaluation went where it matters to the verdict, e.g. the
                                   // runtime taken from trials on fresh input values
  uint64_t output_bytes = 0;       // bytes the candidate's outputs occupy
  double bound_ms = 0;             // the device bound: the least time writing them takes (0: not applied)
  friend bool operator==(const EvalResult&, const EvalResult&) = default;
  MSGPACK_DEFINE_MAP(sample_id, task_id, status, error, assembled_code, compile_log, output, correctness, runtime,
                     ref_runtime, speedup, evaluator_id, device, wall_s, kernel_coverage, compile_s, compile_cached,
                     reverified, isolation_s, ready_at, device_start, device_end, device_peak_bytes, review, note,
                     output_bytes, bound_ms);
};

// A rollout with its verdict and reward: what the store and the learner receive.
struct ScoredRollout {
  Rollout rollout;
  EvalResult result;
  double reward = 0;
  friend bool operator==(const ScoredRollout&, const ScoredRollout&) = default;
  MSGPACK_DEFINE_MAP(rollout, result, reward);
};

// Summary of one experiment step.
struct StepStats {
  uint32_t step = 0;
  uint64_t samples = 0;                           // samples with a verdict this step
  uint64_t correct = 0;                           // samples with status ok
  double fast_1 = 0;                              // fraction of samples correct and faster than the reference
  double mean_speedup = 0;                        // over correct samples
  double mean_reward = 0;                         // over all samples
  uint64_t policy_version = 0;                    // version that sampled this step
  std::map<std::string, uint64_t> status_counts;  // status name -> count
  friend bool operator==(const StepStats&, const StepStats&) = default;
  MSGPACK_DEFINE_MAP(step, samples, correct, fast_1, mean_speedup, mean_reward, policy_version, status_counts);
};

// A saved adapter and its score.
struct Checkpoint {
  uint32_t step = 0;
  uint64_t policy_version = 0;
  std::string path;  // directory of the PEFT-format adapter
  double score = 0;  // fast_1 of its step
  friend bool operator==(const Checkpoint&, const Checkpoint&) = default;
  MSGPACK_DEFINE_MAP(step, policy_version, path, score);
};

// One named tensor of an adapter, raw bytes in row-major order.
struct TensorBlob {
  std::string name;   // PEFT key name
  std::string dtype;  // "f32", "f16", "bf16"
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
  friend bool operator==(const TensorBlob&, const TensorBlob&) = default;
  MSGPACK_DEFINE_MAP(name, dtype, shape, data);
};

// New policy weights published by the learner; samplers acknowledge `version`. `checksum`: hex
// SHA-256 of the tensors (weights_checksum); a sampler refuses an update whose tensors do not
// match it (make_weights_update fills it).
struct WeightsUpdate {
  uint64_t version = 0;
  std::vector<TensorBlob> tensors;
  std::string checksum;
  friend bool operator==(const WeightsUpdate&, const WeightsUpdate&) = default;
  MSGPACK_DEFINE_MAP(version, tensors, checksum);
};

// Hex SHA-256 over each tensor's name, dtype, shape and bytes, in order.
std::string weights_checksum(const std::vector<TensorBlob>& tensors);
WeightsUpdate make_weights_update(uint64_t version, std::vector<TensorBlob> tensors);

// One earlier turn of an episode, as a later turn's prompt shows it.
struct Attempt {
  std::string sample_id;   // the stored sample it was
  std::string completion;  // the policy's action
  std::string feedback;    // the evaluator's verdict on it, written for the policy (feedback_text)
  friend bool operator==(const Attempt&, const Attempt&) = default;
  MSGPACK_DEFINE_MAP(sample_id, completion, feedback);
};

// What the supervisor asks a sampler for in one step: n samples of task_ids[i] as group
// group_ids[i] (group ids are unique within a run, so sample ids are too).
// A later turn of multi-turn episodes (turn > 1) is one group: sample j continues episode j, its
// prompt the task's with history[j] (that episode's earlier attempts, oldest first) after it.
struct SamplePlan {
  uint32_t step = 0;
  std::vector<std::string> task_ids;
  std::vector<uint64_t> group_ids;            // one per task id
  uint32_t n = 1;                             // samples per group
  std::string split;                          // Rollout::split of every sample of the plan
  uint32_t first_index = 0;                   // sample_index of each group's first sample (a group completed
                                              // after a restart continues where its stored samples end)
  uint32_t turn = 0;                          // Rollout::turn of every sample (0: single-turn)
  std::vector<std::vector<Attempt>> history;  // turn > 1: one per sample, from first_index on
  friend bool operator==(const SamplePlan&, const SamplePlan&) = default;
  MSGPACK_DEFINE_MAP(step, task_ids, group_ids, n, split, first_index, turn, history);
};

// The learner's report of one optimizer step, sent to the supervisor once every sampler has
// acknowledged the new version (or with `error` set when that failed: the run stops).
struct StepUpdate {
  uint32_t step = 0;                    // the experiment step whose samples it learned from
  uint64_t policy_version = 0;          // the version now served
  std::string checkpoint;               // directory of the saved adapter (RUN_DIR/checkpoints/step-N)
  std::map<std::string, double> stats;  // loss, grad_norm, lr, clip_fraction, entropy, ...
  std::string error;                    // not empty: the step failed
  friend bool operator==(const StepUpdate&, const StepUpdate&) = default;
  MSGPACK_DEFINE_MAP(step, policy_version, checkpoint, stats, error);
};

// A snapshot of some actor's counters for the monitor.
struct Telemetry {
  double ts = 0;       // seconds since the epoch
  std::string source;  // "supervisor", "dispatcher", "node/evaluator-0", ...
  uint32_t step = 0;
  std::map<std::string, double> values;  // named gauges and counters
  friend bool operator==(const Telemetry&, const Telemetry&) = default;
  MSGPACK_DEFINE_MAP(ts, source, step, values);
};

// ---------------------------------------------------------------------------------------------
// CAF inspection (0.17): the field order is the binary wire format.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Rollout& x) {
  return f(caf::meta::type_name("kernelrl.Rollout"), x.sample_id, x.task_id, x.group_id, x.sample_index, x.step,
           x.prompt, x.completion, x.token_ids, x.logprobs, x.policy_version, x.sampler_id, x.split, x.prompt_tokens,
           x.turn, x.parent_id);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, EvalRequest& x) {
  return f(caf::meta::type_name("kernelrl.EvalRequest"), x.sample_id, x.task_id, x.task_path, x.action, x.action_space,
           x.mode, x.seed, x.attempt);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RuntimeStats& x) {
  return f(caf::meta::type_name("kernelrl.RuntimeStats"), x.median_ms, x.mean_ms, x.std_ms, x.min_ms, x.max_ms,
           x.trials);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Correctness& x) {
  return f(caf::meta::type_name("kernelrl.Correctness"), x.trials, x.passed, x.max_abs_diff, x.max_rel_diff, x.atol,
           x.rtol, x.detail, x.max_scale_err, x.scale_tol, x.ref_noise, x.distributions, x.failed_distribution,
           x.failed_seed);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, EvalResult& x) {
  return f(caf::meta::type_name("kernelrl.EvalResult"), x.sample_id, x.task_id, x.status, x.error, x.assembled_code,
           x.compile_log, x.output, x.correctness, x.runtime, x.ref_runtime, x.speedup, x.evaluator_id, x.device,
           x.wall_s, x.kernel_coverage, x.compile_s, x.compile_cached, x.reverified, x.isolation_s, x.ready_at,
           x.device_start, x.device_end, x.device_peak_bytes, x.review, x.note, x.output_bytes, x.bound_ms);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ScoredRollout& x) {
  return f(caf::meta::type_name("kernelrl.ScoredRollout"), x.rollout, x.result, x.reward);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepStats& x) {
  return f(caf::meta::type_name("kernelrl.StepStats"), x.step, x.samples, x.correct, x.fast_1, x.mean_speedup,
           x.mean_reward, x.policy_version, x.status_counts);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Checkpoint& x) {
  return f(caf::meta::type_name("kernelrl.Checkpoint"), x.step, x.policy_version, x.path, x.score);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TensorBlob& x) {
  return f(caf::meta::type_name("kernelrl.TensorBlob"), x.name, x.dtype, x.shape, x.data);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WeightsUpdate& x) {
  return f(caf::meta::type_name("kernelrl.WeightsUpdate"), x.version, x.tensors, x.checksum);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Attempt& x) {
  return f(caf::meta::type_name("kernelrl.Attempt"), x.sample_id, x.completion, x.feedback);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SamplePlan& x) {
  return f(caf::meta::type_name("kernelrl.SamplePlan"), x.step, x.task_ids, x.group_ids, x.n, x.split, x.first_index,
           x.turn, x.history);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepUpdate& x) {
  return f(caf::meta::type_name("kernelrl.StepUpdate"), x.step, x.policy_version, x.checkpoint, x.stats, x.error);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Telemetry& x) {
  return f(caf::meta::type_name("kernelrl.Telemetry"), x.ts, x.source, x.step, x.values);
}

// Registers every message type above with its CAF type name. Call once per actor system.
void add_message_types(caf::actor_system_config& cfg);

// ---------------------------------------------------------------------------------------------
// Atoms (at most 10 characters each in CAF 0.17).
using plan_atom = caf::atom_constant<caf::atom("plan")>;          // supervisor -> sampler
using done_atom = caf::atom_constant<caf::atom("done")>;          // sampler -> supervisor
using register_atom = caf::atom_constant<caf::atom("register")>;  // evaluator -> dispatcher
using eval_atom = caf::atom_constant<caf::atom("eval")>;          // dispatcher -> evaluator
using score_atom = caf::atom_constant<caf::atom("score")>;        // dispatcher -> reward
// sampler -> dispatcher: (skip_atom, Rollout): a rollout left out before evaluation; it goes on to
// the reward and the store with status skipped
using skip_atom = caf::atom_constant<caf::atom("skip")>;
using record_atom = caf::atom_constant<caf::atom("record")>;    // reward -> supervisor
using train_atom = caf::atom_constant<caf::atom("train")>;      // reward -> learner
using publish_atom = caf::atom_constant<caf::atom("publish")>;  // -> monitor
using stats_atom = caf::atom_constant<caf::atom("stats")>;      // query counters
using tick_atom = caf::atom_constant<caf::atom("tick")>;        // self timers
using best_atom = caf::atom_constant<caf::atom("best")>;        // -> checkpoint_selector
using keep_atom = caf::atom_constant<caf::atom("keep")>;        // supervisor -> checkpoint_selector: pin a step
using sync_atom = caf::atom_constant<caf::atom("sync")>;        // supervisor -> learner: publish
                                                                // the current weights
using finish_atom = caf::atom_constant<caf::atom("finish")>;    // orderly end of a run
// launch -> supervisor: (interrupt_atom, why): SIGINT or SIGTERM; the run ends now as an
// interruption (its store says "interrupted"; a learning run resumes from its last checkpoint)
using interrupt_atom = caf::atom_constant<caf::atom("interrupt")>;
using compile_atom = caf::atom_constant<caf::atom("compile")>;  // evaluator -> its compile stage
// dispatcher -> evaluator: (withdraw_atom, sample_id): give back a request it has not started
// (its eval request then fails with withdrawn_error); one already running is left to finish.
using withdraw_atom = caf::atom_constant<caf::atom("withdraw")>;
inline constexpr const char* withdrawn_error = "withdrawn by the dispatcher before it started";
using challenge_atom = caf::atom_constant<caf::atom("challenge")>;  // node -> gate: a nonce, please
// node -> gate: (join_atom, node name, cluster name, protocol_version, proof) -> bool. Its shape
// never changes, so a peer of any version gets a clear answer.
using join_atom = caf::atom_constant<caf::atom("join")>;
// peer -> gate, before joining: (hello_atom) -> [cluster name, protocol version]. Its shape never
// changes either; nothing in it is secret.
using hello_atom = caf::atom_constant<caf::atom("hello")>;
// A sampler on another node: (register_atom, sampler_atom, actor, id): it is running (node -> gate
// -> supervisor, which has the learner bring it to the current policy version before it plans
// work for it); its rollouts go through the gate to the dispatcher.
using sampler_atom = caf::atom_constant<caf::atom("sampler")>;
// The learner on another node: (learner_atom) -> (std::string run_dir, bool resume) (node -> gate:
// where its checkpoints go, and whether it resumes from the newest there); then (register_atom,
// learner_atom, learner, checkpoint_selector) -> bool (node -> gate -> supervisor, which starts a
// learning run once its learner is in).
using learner_atom = caf::atom_constant<caf::atom("learner")>;
// The monitor on another node: (monitor_atom) -> (std::string run_dir, actor recorder) (node ->
// gate: where its metrics.jsonl goes, and the supervisor that stores its snapshots); then
// (register_atom, monitor_atom, monitor) -> bool (the gate registers every telemetry source with
// it and forwards `launch monitor HOST:PORT` and the run's final snapshot to it).
using monitor_atom = caf::atom_constant<caf::atom("monitor")>;
// `launch serve`'s front, to itself or from its caller: (listen_atom) -> port (bind and answer the
// port); (linger_atom, connection, serial) (close a refused connection once its answer is read).
using listen_atom = caf::atom_constant<caf::atom("listen")>;
using linger_atom = caf::atom_constant<caf::atom("linger")>;

// The text of an error for people: the message a peer or an actor put in it (e.g. the gate's
// "refused by the head: ..."), else CAF's rendering of it.
std::string error_text(caf::actor_system& sys, const caf::error& e);

// Helpers to build ids the same way everywhere. A later turn of an episode (turn > 1) has its own
// group id, so the id needs nothing more.
std::string make_sample_id(const std::string& task_id, uint64_t group_id, uint32_t sample_index);

}  // namespace kernelrl

MSGPACK_ADD_ENUM(kernelrl::EvalStatus);

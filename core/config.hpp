// The one TOML schema of the whole system. load_config() validates everything and reports each
// problem as "FILE:LINE:COLUMN: key.path: what was expected"; nothing half-valid is returned.
// Relative paths in a config file are resolved against the directory of that file.
#pragma once

#include "core/mode.hpp"
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace kernelrl {

// "HOST:PORT" into its parts; false when it is not that shape or the port is above 65535.
bool parse_host_port(const std::string& s, std::string& host, uint16_t& port);

struct ClusterConfig {
  std::string name = "local";             // cluster name, shown in logs and the store; peers must match
  std::string log_level = "info";         // trace, debug, info, warn, error, off
  std::string head;                       // "HOST:PORT" nodes reach the head at ("": the supervisor
                                          // node's host and port)
  std::string secret_file;                // file holding the cluster secret (or $KERNELRL_CLUSTER_SECRET);
                                          // required once a node publishes a port
  double heartbeat_s = 1.0;               // middleman heartbeat interval
  double peer_timeout_s = 5.0;            // a peer silent this long is taken as gone
  double join_wait_s = 120.0;             // how long the head waits for its first evaluator
  bool tls = false;                       // mutual TLS between nodes (CAF's OpenSSL transport): every peer
                                          // presents tls_cert, signed by the CA in tls_ca
  std::string tls_cert, tls_key, tls_ca;  // PEM files; the same paths on every machine, each
                                          // holding its own node's certificate and key
};

struct NodeConfig {
  std::string name = "local";      // unique node name
  std::string host = "127.0.0.1";  // interface to bind / address to reach it
  uint16_t port = 0;               // middleman port (0: not published; single node)
  std::vector<std::string> roles;  // supervisor, learner, sampler, evaluator, monitor
  uint32_t cpu_slots = 0;          // CPU evaluators on this node (one worker process each)
  std::vector<int64_t> gpus;       // CUDA device ids, per_gpu evaluators each
  uint32_t per_gpu = 1;            // evaluators on each GPU: their candidates build, load and check
                                   // at once; timed regions run alone (gpu/devlock.py)
  bool gpus_auto = false;          // gpus = "auto": every GPU this node's process sees, one
                                   // evaluator each; the cpu_slots CPU evaluators only when it sees
                                   // none (resolved when the node starts: resolve_auto_devices)
  // The sampler role: one sampler per entry, the libtorch backend's devices or the openai
  // backend's servers as this machine reaches them; empty: [sampler] devices / urls (or url).
  std::vector<std::string> sampler_devices, sampler_urls;
};

struct TasksConfig {
  std::string dir;                             // folder of KernelBench-format task files (bundled: tasks/bundled)
  std::string kernelbench_dir;                 // or a KernelBench checkout, used as it is (instead of dir)
  uint32_t level = 1;                          // with kernelbench_dir: the level folder (KernelBench/levelN)
  std::vector<std::string> ids;                // file stems, problem numbers "7" or ranges "1-10"; empty: all
  std::string split;                           // a named split of split_file (e.g. "train", "eval"); "": none
  std::string split_file;                      // TOML file with [splits] name = [ids...] (default: tasks/splits.toml)
  std::vector<std::string> languages{"cuda"};  // the kernel languages the prompt offers: cuda, triton
  // The folder the tasks come from: dir, or kernelbench_dir's level folder.
  std::string folder() const;
};

struct PolicyConfig {
  std::string model;           // Hugging Face model directory (the libtorch sampler's model)
  std::string adapter;         // PEFT adapter directory to start from (optional)
  std::string dtype = "bf16";  // f32, f16, bf16
  std::string device = "cpu";  // where the libtorch sampler runs the model: cpu, cuda[:N], or auto
                               // (cuda:0 when this process sees a GPU, else cpu)
  // Prompt template: "auto" (the model's own chat template, tokenizer_config.json's chat_template
  // as transformers renders it; "chatml" where the model has none, said at start), "chatml"
  // (Qwen2), "llama3", "plain", or a string holding {system} and {user} (the assistant's turn
  // starts where the string ends).
  std::string template_ = "auto";
  std::string system = "You are an expert CUDA and PyTorch performance engineer.";  // system message
  // Filled when "auto" is resolved (launch/setup.cpp resolve_chat_template), never read from a
  // file: template_ then holds the model's first-turn template with {system} and {user}, and these
  // the text its template puts between a user message and the answer after it, between an answer
  // and the next user message, and after the last user message (multi-turn prompts).
  struct TurnText {
    std::string user_to_assistant, assistant_to_user, generation;
  };
  std::optional<TurnText> model_turns;
};

struct SamplerConfig {
  std::string backend = "replay";  // replay, libtorch (the in-process [policy] model) or openai (a
                                   // vLLM/SGLang server speaking /v1/completions)
  std::string replay;              // JSONL file, a folder of *.jsonl, or an earlier run directory
  // Benchmarks of the loop's pace only (model backends): each sample's completion is replaced by one
  // of these recorded actions of its task (JSONL file or folder, as `replay`), so the evaluators see
  // a real mix of correct, wrong and failing programs while the model still generates and the
  // learner still trains on its tokens. The rewards then say nothing about the policy.
  std::string bench_actions;
  uint32_t samples_per_task = 0;               // replay: at most this many actions per task (0: all);
                                               // libtorch/openai: samples per task and step (0: 1)
  double temperature = 1.0;                    // sampling temperature (model backends)
  double top_p = 1.0;                          // nucleus sampling (model backends)
  uint32_t max_tokens = 1024;                  // completion length limit (model backends)
  std::vector<std::string> stop;               // stop strings (model backends)
  uint64_t seed = 0;                           // sampling seed
  uint32_t batch_prompts = 8;                  // prompts generated together; their rollouts leave as a batch
  std::string url;                             // openai: server root, e.g. "http://10.0.0.5:8000"
  std::vector<std::string> urls;               // openai: several servers, one sampler each (instead of url)
  std::vector<std::string> devices;            // libtorch: one sampler per device, each with its own copy
                                               // of the model (default: one on [policy] device)
  std::string served_model;                    // openai: the served model name
  std::string api_key_env = "OPENAI_API_KEY";  // openai: environment variable holding the key
  double timeout_s = 600;                      // openai: limit for one HTTP exchange
  uint32_t max_retries = 4;                    // openai: extra attempts after 5xx, 429, timeouts
  std::string adapter_dir;                     // openai: where weight updates are written for the server to
                                               // load (a path it can read; default RUN_DIR/adapters)
  uint32_t max_failures = 0;                   // model backends: failed generations in a row after which a
                                               // sampler stops and its work moves to the others (0: never)
  uint32_t max_pending = 256;                  // rollouts waiting in the dispatcher's queue before samplers
                                               // are held back (backpressure)
};

struct EvaluatorConfig {
  std::string action_space = "forward_body";  // forward_body or full_program
  std::string mode = "fast";                  // timing protocol: fast or full
  uint32_t correctness_trials = 5;            // trials with fresh inputs before timing
  uint32_t warmup = 2;                        // untimed runs before timing
  uint32_t fast_trials = 5;                   // timed runs in fast mode
  uint32_t full_trials = 50;                  // timed runs in full mode (at most: timing_precision)
  double timing_precision = 0.005;            // timed runs stop after 20 once the median's 95% confidence
                                              // interval is within +-this fraction of it (0: every run)
  double timeout_s = 60;                      // wall-clock limit for one evaluation (worker is killed)
  double atol_fp32 = 1e-4;                    // tolerances for float32 outputs
  double rtol_fp32 = 1e-4;
  double atol_half = 1e-2;  // tolerances for float16 / bfloat16 outputs
  double rtol_half = 1e-2;
  uint32_t max_in_flight = 0;      // requests queued at one evaluator (0: compile_workers + 2)
  uint32_t max_attempts = 2;       // dispatches of one sample before it is recorded as failed
  uint32_t torch_threads = 1;      // intra-op threads of a CPU worker
  uint64_t seed = 42;              // base seed for weights and inputs
  std::string python;              // interpreter for workers (default: scripts/python)
  std::string task_size = "auto";  // task sizes: cpu, gpu (a task's GPU_SIZES), auto (by device)
  uint32_t compile_workers = 2;    // CPU processes building kernels ahead of the timing stage
                                   // (0: candidates build in the timing stage)
  double compile_timeout_s = 600;  // wall-clock limit for building one candidate's kernels
  // Host memory of one candidate's processes together, in MB (0: no limit). "auto" (the default):
  // this machine's memory, less headroom, shared by every candidate that can run at once on it
  // (core/machine.hpp); resolved by each node for itself.
  uint32_t memory_limit_mb = 0;
  bool memory_auto = true;
  double reverify_speedup = 10;  // speedups above this are re-verified in full (0: never)
  double review_speedup = 0;     // speedups above this that stand after re-verification are unconfirmed
                                 // until `launch confirm` (0: off; 10: KernelBench's review threshold)
  // Correctness trials beyond the task's own draw, one each, in this order (docs/EVALUATION.md):
  // signed (random signs), large (x256), zeros (an eighth of the elements 0); a distribution on
  // which the reference's outputs hold NaN or Inf is outside its domain and left out. [] : none.
  std::vector<std::string> input_distributions{"signed", "large", "zeros"};
  double scale_tol_fp32 = 1e-2;    // the scale rule: an output's root-mean-square error relative to the
  double scale_tol_half = 5e-2;    // reference's own (float32 / float16 and bfloat16 outputs; 0: off)
  bool bandwidth_bound = true;     // the device bound: a candidate faster than writing its outputs takes
                                   // at twice the measured bandwidth is re-verified and, if it stands,
                                   // unconfirmed
  double bound_min_output_mb = 0;  // outputs smaller than this are left out of the bound (0: 4x the
                                   // device's last-level cache, which can absorb smaller writes)
  // The reference's outputs each judge keeps for a task's later candidates, in MB of device memory
  // (of host memory on CPU; at most 1/16 of it); 0: the reference runs for every candidate.
  double reference_cache_mb = 2048;
  bool isolate_network = true;      // candidates run in a network namespace of their own
  std::string cache_dir;            // build cache (default ~/.cache/kernelrl/build-cache)
  std::string backend = "worker";   // worker: real evaluation; synthetic: answers after
                                    // synthetic_latency_ms without running anything (benchmarks
                                    // of dispatch and scale-out; its verdicts are not measurements)
  double synthetic_latency_ms = 0;  // per-request latency of a synthetic evaluator
  // Requests one evaluator may hold (queued, compiling or timing).
  uint32_t in_flight() const { return max_in_flight ? max_in_flight : compile_workers + 2; }
};

struct RewardConfig {
  std::string shape = "speedup";       // speedup, log_speedup, none (correct samples get
                                       // correct_bonus alone: a reward of correctness only), or
                                       // threshold (1 when correct and speedup > threshold, else 0:
                                       // the sparse fast_p reward)
  double threshold = 1.0;              // shape = "threshold": the speedup to beat
  double max_speedup = 0;              // 0: no cap, the raw speedup (the seeds' reward); N >= 1: speedups
                                       // are clipped to N before shaping. Either way a speedup above
                                       // [evaluator] reverify_speedup is re-verified in full first
  double correct_bonus = 0;            // added to the reward of every correct sample
  std::string normalize = "none";      // none, or task_mean: the speedup term over the running mean
                                       // of that task's correct speedups (per-task normalization)
  double coverage_weight = 0;          // + weight * kernel coverage for correct samples (GPU)
  double min_coverage = 0;             // correct samples whose measured coverage is below this are
                                       // rejected as lazy: reward lazy_reward
  double lazy_reward = 0;              // reward of a rejected lazy sample
  double reject_coverage_below = 0;    // profiling rejection sampling: correct samples whose measured
                                       // coverage is below this leave the learner's batch (0: off)
  double reject_keep_probability = 0;  // ... unless kept by a draw with this probability
  double incorrect_reward = 0;         // reward of a sample that ran but was wrong
  double failure_reward = 0;           // reward of format/compile/runtime errors and timeouts
  double hacked_reward = 0;            // reward of a sample caught gaming the harness
  double unconfirmed_speedup = 1.0;    // an unconfirmed verdict (a speedup beyond the device bound or
                                       // above [evaluator] review_speedup) is rewarded as a
                                       // correct sample of this speedup (its own if lower) until
                                       // `launch confirm` decides it
};

struct LearnerConfig {
  std::string algorithm = "grpo";         // advantage estimator: grpo, dr_grpo, rloo or trloo
  double adv_eps = 1e-4;                  // grpo: added to the group's reward std
  double turn_gamma = 1.0;                // multi-turn ([experiment] turns > 1): each turn learns from its
                                          // return r_t + turn_gamma * (the next turn's return)
  double turn_progress = 0.0;             // multi-turn: a later turn learns from its return +
                                          // turn_progress * (r_t - r_{t-1}), its progress over the
                                          // turn before (SCoRe); earlier turns' returns carry raw rewards
  std::string learn_turns = "all";        // multi-turn: every turn's group goes to the learner ("all"), or
                                          // the last turn's only ("last"; earlier turns are sampled,
                                          // evaluated, stored and counted, not learned from)
  uint32_t steps = 10;                    // train: optimizer steps (policy versions) of the run
  uint32_t batch_size = 8;                // tasks per step
  uint32_t group_size = 8;                // samples per task per step (a GRPO group)
  uint32_t minibatch_size = 8;            // sequences per forward/backward
  bool activation_checkpointing = false;  // keep each layer's input only and recompute the layer
                                          // in the backward pass (long sequences, large models)
  uint32_t lora_rank = 16;                // fresh adapter (when [policy] adapter is not set): rank,
  double lora_alpha = 32;                 //   alpha,
  double lora_dropout = 0;                //   dropout on the adapter input while training,
  std::vector<std::string> lora_targets{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  double learning_rate = 1e-5;             // AdamW peak learning rate
  double weight_decay = 0;                 // AdamW weight decay
  double max_grad_norm = 1.0;              // gradient-norm clipping (0: off)
  std::string lr_schedule = "constant";    // constant, linear or cosine (to 0 at the last step)
  uint32_t warmup_steps = 0;               // linear warmup steps before the schedule
  double clip_low = 0.2;                   // PPO clip range below 1
  double clip_high = 0.2;                  // PPO clip range above 1 (clip-higher: e.g. 0.28)
  std::string mismatch = "off";            // mismatch rejection sampling: "token" or "sequence" drops
                                           // tokens / sequences whose learner and sampler logprobs
  double mismatch_threshold = 0.5;         // differ by more than this |log ratio| (sequence: mean)
  std::string aggregation = "token_mean";  // token_mean or seq_mean
  double kl_coef = 0;                      // k3 KL to the base policy (adapter off); 0: none
  double entropy_coef = 0;                 // entropy bonus: the loss minus entropy_coef x the policy's
                                           // mean token entropy (entropy-regularized training); 0: none
  std::string device;                      // where the learner trains ("": [policy] device)
  std::vector<std::string> devices;        // data-parallel: one rank per entry, all "cpu" or all
                                           // distinct "cuda:N" (c10d gloo / NCCL); device is then
                                           // the first; empty: device alone
  std::string dtype;                       // base weights' dtype ("": [policy] dtype); the adapter is f32
  uint32_t max_staleness = 0;              // samples from a policy this many versions behind the newest
                                           // are still learned from (0: strictly on-policy); older ones
                                           // are rejected, reported and their group sampled again
  double sync_timeout_s = 300;             // a sampler must acknowledge new weights within this; if it
                                           // does not, the run stops with an error
  uint32_t keep_last = 3;                  // checkpoints kept besides the best by fast_1 and step 0
                                           // (0: every checkpoint, e.g. for `launch probe`)
};

// SDPO (mode = "sdpo"): the teacher's context; see learner/sdpo.hpp.
struct SdpoConfig {
  std::string context = "feedback";  // feedback (demonstration + execution feedback) or prompt
                                     // (demonstration only)
  bool demonstration = true;         // show the teacher the group's best correct sample (another one's)
  double beta = 1.0;                 // advantage = beta * (teacher - student logprob)
  uint32_t max_error_chars = 1500;   // error and build output kept in the feedback
};

struct ExperimentConfig {
  Mode mode = Mode::eval;                // eval; best_of_n (k samples per task, for selection
                                         // strategies); train (RLVR: [learner] steps of GRPO on the tasks);
                                         // ttt (test-time adaptation: every step on all the tasks);
                                         // sdpo (ttt's loop, learning by self-distillation: [sdpo])
  uint32_t k = 0;                        // best_of_n: samples per task (sets [sampler] samples_per_task)
  uint32_t evaluate_top_m = 0;           // best_of_n: evaluate only each task's m most surprising samples
                                         // (ranked by mean logprob before any evaluation; the deployable
                                         // top-m); the rest are stored unevaluated. 0: evaluate all K
  uint32_t patience = 0;                 // train, ttt, sdpo: stop after this many steps without a better
                                         // fast_1 (0: run every step); the best step is reported (BoA)
  bool per_task = false;                 // ttt, sdpo: one run per task (a fresh adapter from the same start each),
                                         // aggregated into one run's figures (launch/per_task.cpp)
  std::string early_stop = "no_better";  // patience's rule: "no_better" (steps without a new best)
                                         // or "regressions" (steps each below the one before)
  // train: periodic evaluation on held-out tasks (an eval split): the policy of every
  // eval_every-th version (and the first and the last) samples eval_samples completions of each
  // eval task; they are evaluated and stored (Rollout::split "eval") but never learned from.
  std::string eval_split;             // a named split of [tasks] split_file ("": none)
  std::vector<std::string> eval_ids;  // or task ids, numbers, ranges of [tasks]' folder
  uint32_t eval_every = 0;            // versions between evaluations (0: only the first and the last)
  uint32_t eval_samples = 0;          // samples per eval task and evaluation (0: [learner] group_size)
  TasksConfig eval_tasks;             // filled by load_config: the eval tasks' selection (empty
                                      // ids and split: no periodic evaluation)
  bool evaluates() const { return !eval_tasks.ids.empty() || !eval_tasks.split.empty(); }
  std::string name = "run";       // prefix of the run directory name
  std::string run_root = "runs";  // where run directories are created
  uint64_t seed = 0;              // experiment seed
  // Multi-turn refinement: each episode is `turns` samples, turn t's prompt the task with the
  // episode's earlier attempts and the evaluator's feedback on each (train, ttt, eval,
  // best_of_n; a model sampler). Each turn of a group is a group of its own (GRPO over the
  // group's episodes at that turn); later turns are planned as the turn before comes in.
  uint32_t turns = 1;
  uint32_t turn_prompt_tokens = 8192;  // a later turn's prompt is cut to this many tokens: the
                                       // oldest attempts' code goes first, then the middle of the
                                       // latest (tasks/prompt.hpp, render_turn_prompt)
  uint32_t feedback_chars = 2000;      // one attempt's feedback at most (logs keep head and tail)
};

// [tracking]: the run's metrics, config and summary in an experiment tracker, logged by
// tracking/tracker.py (the library's own client) beside the run.
struct TrackingConfig {
  std::string backend = "none";      // none, wandb (offline unless WANDB_MODE says otherwise),
                                     // tensorboard (tensorboardX event files) or mlflow
  std::string project = "kernelrl";  // the W&B project, the MLflow experiment
  std::string name;                  // the run's name there ("": the run directory's name)
  std::string dir;                   // where its local files go ("": RUN_DIR/tracking)
  std::string python;                // the tracking environment (default: scripts/tracking-python)
};

struct StoreConfig {
  std::string file = "store.sqlite";   // file name inside the run directory
  std::string synchronous = "normal";  // SQLite synchronous level under WAL: normal or full
};

struct MonitorConfig {
  bool progress = true;                        // live progress line on the terminal
  double interval_s = 1.0;                     // refresh interval of progress and metrics
  std::string metrics_file = "metrics.jsonl";  // inside the run directory
  std::string publish;                         // ZeroMQ PUB endpoint for telemetry snapshots (msgpack), e.g.
                                               // "tcp://127.0.0.1:47312" ("": none). Anyone who can reach it can read
                                               // the telemetry: bind it to an interface only trusted hosts reach.
  std::string publish_key;                     // CURVE: the publisher's secret key file (`launch keygen`); with
  std::string publish_clients;                 // the readers' public keys (one per line), the socket is encrypted,
                                               // admits only those readers, and may bind a non-loopback address
};

struct Config {
  std::string source_file;  // absolute path of the file this came from
  std::string base_dir;     // its directory; relative paths were resolved against it
  ClusterConfig cluster;
  std::vector<NodeConfig> nodes;
  TasksConfig tasks;
  PolicyConfig policy;
  SamplerConfig sampler;
  EvaluatorConfig evaluator;
  RewardConfig reward;
  LearnerConfig learner;
  ExperimentConfig experiment;
  SdpoConfig sdpo;
  TrackingConfig tracking;
  StoreConfig store;
  MonitorConfig monitor;
  std::string resolved_toml;  // the whole config with defaults filled in and paths resolved
};

// One problem found in a config, already formatted as FILE:LINE:COLUMN: key.path: message.
struct ConfigError {
  std::string file;
  uint32_t line = 0, column = 0;
  std::string key;
  std::string message;
  std::string format() const;
};

// Either a valid config or every problem found in it (never both, never neither).
using ConfigResult = std::variant<Config, std::vector<ConfigError>>;

// Reads and validates a config file, with command-line overrides (`--set KEY=VALUE`, see
// config_toml.hpp apply_overrides) applied before it is read.
ConfigResult load_config(const std::string& path, const std::vector<std::string>& sets = {});
// Validates config text as if it came from `path` (used by tests and the embedded default).
ConfigResult parse_config(const std::string& text, const std::string& path);

}  // namespace kernelrl

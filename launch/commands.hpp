// The subcommands of `launch`. Each returns the process exit code: 0 success, 1 failure,
// 2 bad input (config, arguments).
#pragma once

#include <string>
#include <vector>
#include <cstdint>

namespace kernelrl {

// launch CONFIG [--run-dir DIR] [--log-level LEVEL]
// resume: continue the train run in run_dir from its latest checkpoint and its store.
int cmd_run(const std::string& config_path, const std::string& run_dir, const std::string& log_level,
            bool resume = false);
// launch CONFIG --node NAME [--log-level LEVEL]: one non-head node of a cluster
int cmd_node(const std::string& config_path, const std::string& node, const std::string& log_level);
// launch CONFIG --join [--name NAME] [--cpu-slots N] [--gpus 0,1]: a machine not in CONFIG
struct JoinOptions;
int cmd_join(const std::string& config_path, const JoinOptions& o, const std::string& log_level);

// launch monitor HOST:PORT [--once] [--json] [--interval S] [--secret-file FILE] [--wait S]
struct MonitorOptions {
  std::string address;                    // the head's HOST:PORT
  bool once = false;                      // one snapshot, then exit
  bool json = false;                      // JSON lines instead of text
  double interval_s = 1.0;                // refresh interval
  double wait_s = 10;                     // how long to keep trying to reach the head
  std::string secret_file;                // the cluster secret ("": $KERNELRL_CLUSTER_SECRET)
  std::string log_level;                  // default warn
  std::string tls_cert, tls_key, tls_ca;  // a head with [cluster] tls: this monitor's certificate
};
int cmd_monitor(const MonitorOptions& o);

// launch check CONFIG
int cmd_check(const std::string& config_path);
// Prints, one JSON object per line, each task's prompt as the sampler renders it ([tasks], then
// [experiment] eval tasks): task_id, split ("" or "eval"), prompt.
int cmd_prompts(const std::string& config_path);
// Comparison configs (launch/comparison.cpp): a [comparison] table lists arms, each the rest of the
// file with its [arm.NAME] tables merged in; `launch CONFIG` runs every arm, then compares them.
bool is_comparison_config(const std::string& path);
int cmd_check_comparison(const std::string& path);
int cmd_run_comparison(const std::string& path, const std::string& run_dir, const std::string& log_level);
// [experiment] per_task = true (launch/per_task.cpp): one `launch` run per task in RUN_DIR/tasks/ID,
// then aggregated into RUN_DIR as one run (store, compute.json, a per-task Best-of-Adaptation).
struct Config;
int cmd_run_per_task(const Config& cfg, const std::string& run_dir, const std::string& log_level);
// launch export RUN_DIR --jsonl
int cmd_export(const std::string& run_dir);
// launch confirm RUN_DIR [SAMPLE_ID...] [--reject] [--note TEXT]: decide unconfirmed verdicts (none
// given: list them)
int cmd_confirm(const std::string& run_dir, const std::vector<std::string>& samples, bool reject,
                const std::string& note);
// launch version
int cmd_version();

// launch generate / score / tokenize: the policy runtime from the command line.
struct PolicyCliOptions {
  std::string model;                 // Hugging Face model directory
  std::string adapter;               // PEFT adapter directory ("": none)
  std::string device = "cpu";        // cpu or cuda:N
  std::string dtype;                 // f32, f16, bf16 ("": f32 on CPU, bf16 on CUDA)
  std::vector<std::string> prompts;  // generate: one or more prompts; score/tokenize: one text
  std::string completion;            // score: the completion text
  double temperature = 1.0;          // generate/score
  double top_p = 1.0;                // generate
  uint32_t max_tokens = 256;         // generate
  uint32_t n = 1;                    // generate: completions per prompt
  int64_t max_rows = 0;              // generate --model: sequences decoded at once (0: all)
  uint64_t seed = 0;                 // generate
  std::vector<std::string> stop;     // generate: stop strings
  bool json = false;                 // one JSON object on stdout
  std::string out;                   // export: destination directory
  bool force = false;                // merge: replace what --out holds
  std::string server;                // generate: an OpenAI-compatible server's URL instead of --model
  std::string served_model;          // generate --server: the served model name
  double timeout_s = 600;            // generate --server: one HTTP exchange
  uint32_t retries = 4;              // generate --server: extra attempts after 5xx/429/timeouts
};
// launch generate --model DIR [--adapter DIR] --prompt TEXT [--prompt TEXT ...] [--max-tokens N]
//                 [--temperature T] [--top-p P] [--n N] [--seed S] [--stop STR ...] [--max-rows R] [--json]
int cmd_generate(const PolicyCliOptions& o);
// launch score --model DIR [--adapter DIR] --prompt TEXT --completion TEXT [--temperature T] [--json]
int cmd_score(const PolicyCliOptions& o);
// launch tokenize --model DIR --prompt TEXT [--json]: token ids and their pieces
int cmd_tokenize(const PolicyCliOptions& o);
// launch merge --model DIR --adapter DIR --out DIR: the adapter folded into a plain HF checkpoint
int cmd_merge(const PolicyCliOptions& o);

// launch evaluate --task TASK_FILE --candidate FILE [--candidate FILE ...] [options]
// launch analyze RUN_DIR: analysis/analysis.hpp over the run's store.
struct AnalyzeOptions {
  std::string run_dir;
  bool json = false;
  std::vector<double> p{1.0, 1.2};  // fast_p thresholds
  std::vector<uint32_t> ks;         // empty: 1, 2, 4, ...
  uint32_t bootstrap = 1000;
  uint64_t seed = 0;
  uint32_t m = 4;   // selection strategies' top-m
  std::string out;  // report: the HTML file ("": RUN_DIR/report.html)
};
int cmd_analyze(const AnalyzeOptions& o);
// launch report RUN_DIR [--out FILE]: the analysis as an offline HTML page with plots (analysis/report.hpp).
int cmd_report(const AnalyzeOptions& o);

// launch compare RUN_DIR RUN_DIR ...: runs side by side, refused unless their budgets match.
struct CompareOptions {
  std::vector<std::string> run_dirs;
  bool allow_mismatch = false;  // compare anyway, listing what differs
  bool json = false;
};
int cmd_compare(const CompareOptions& o);

// launch probe RUN_DIR: fixed samples rescored under every checkpoint of the run (the NLL probe).
struct ProbeOptions {
  std::string run_dir;
  std::string samples_from;   // another run whose samples are rescored ("": run_dir's own first step)
  uint32_t samples = 16;      // the first N samples that have tokens (0: all of them)
  std::string device, dtype;  // "": the run's [policy] device and dtype
  bool json = false;
};
int cmd_probe(const ProbeOptions& o);

// launch sft: LoRA supervised fine-tuning on (prompt, completion) demonstrations (warm starts).
struct SftOptions {
  std::string model, adapter, data, out;  // base model, adapter to start from, JSONL, output dir
  std::string device = "cpu", dtype;      // dtype "": bf16 on CUDA, f32 on the CPU
  uint32_t steps = 100, batch = 8;        // optimizer steps; demonstrations per step
  double lr = 1e-4;
  uint32_t rank = 16;
  double alpha = 32;
  std::vector<std::string> targets{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  uint64_t seed = 0;  // adapter init and demonstration order
  bool json = false;
};
int cmd_sft(const SftOptions& o);

struct EvaluateOptions {
  struct Candidate {
    std::string task;  // KernelBench-format task file
    std::string file;  // the action
  };
  std::vector<Candidate> candidates;  // evaluated in this order (the i-th by evaluator i % per_device)
  std::string action;                 // forward_body or full_program ("": config's / default)
  std::string device = "cpu";         // cpu or cuda:N
  std::string mode;                   // fast or full ("": config's / default)
  double timeout_s = 0;               // per-candidate limit (0: config's / default)
  double timing_precision = -1;       // [evaluator] timing_precision (-1: config's / default)
  double reference_cache_mb = -1;     // [evaluator] reference_cache_mb (-1: config's / default)
  int compile_workers = -1;           // compile-stage processes (-1: config's / default)
  uint32_t per_device = 1;            // evaluators on the device, sharing it (gpu/devlock.py)
  uint64_t seed = 0;                  // base seed (0: config's / default)
  std::string config;                 // optional config whose [evaluator] supplies settings
  std::string worker_log;             // where worker output goes ("": discarded)
  std::string log_level;              // default warn
  bool json = false;                  // one JSON object per line (else a table)
};
int cmd_evaluate(const EvaluateOptions& o);

}  // namespace kernelrl

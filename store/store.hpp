// The run store: one SQLite database (WAL) per run directory that keeps every artifact of every
// sample (raw action, assembled code, compile log, runtime statistics, status, reward, logprob
// summary, policy version), plus steps, checkpoints and telemetry. Each write is its own
// transaction, so a process killed mid-run loses at most the sample being written.
// Not thread-safe: one owner (the supervisor) writes; other processes may read.
#pragma once

#include "messages/messages.hpp"

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

struct sqlite3;

namespace kernelrl {

// One sample as the store keeps it (what `launch export` prints).
struct SampleRow {
  std::string run_id, sample_id, task_id, status, error;
  uint32_t step = 0;
  uint64_t group_id = 0;
  uint32_t sample_index = 0;
  double speedup = 0, reward = 0;
  uint64_t policy_version = 0;
  uint32_t num_tokens = 0;
  double logprob_mean = 0;
  ScoredRollout record;  // the full message, as recorded
};

// Every field of a verdict: status, error, speedup, runtime_ms, ref_runtime_ms, full timing
// statistics, correctness, kernel_coverage, compile_s, compile_cached, reverified, isolation_s...
// (`launch evaluate` prints it per candidate).
nlohmann::json result_json(const EvalResult& r);

// One stored sample as `launch export` prints it and `launch serve` answers it: the verdict's
// fields, the sample's identity, reward and tokens, the raw action, the assembled code and logs.
nlohmann::json sample_json(const SampleRow& r);

// A StepStats as JSON (the store's steps table, checkpoints' stats.json, run summaries).
nlohmann::json step_stats_json(const StepStats& s);

enum class InsertResult { inserted, duplicate, failed };

class Store {
 public:
  // Opens (creating if needed) the database at `path`; synchronous is "normal" or "full".
  // Returns nullptr and sets `err` when it cannot.
  static std::unique_ptr<Store> open(const std::string& path, const std::string& synchronous, std::string& err);
  // Opens an existing database read-only (for export and replay).
  static std::unique_ptr<Store> open_readonly(const std::string& path, std::string& err);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  bool begin_run(const std::string& run_id, const std::string& mode, const std::string& config_toml);
  bool finish_run(const std::string& run_id, const std::string& status, const std::string& summary_json);
  // Idempotent by (run_id, sample_id): a second record of the same sample is a duplicate.
  InsertResult record_sample(const std::string& run_id, const ScoredRollout& s);
  // A step's statistics (replacing an earlier record of the same step), with the learner's
  // figures for the update made from it (loss, grad_norm, ...) when there was one.
  bool record_step(const std::string& run_id, const StepStats& s, const std::map<std::string, double>& learner = {});
  struct StepRow {
    StepStats stats;
    std::map<std::string, double> learner;
  };
  // The recorded steps of a run, by step.
  std::vector<StepRow> steps(const std::string& run_id);
  bool record_checkpoint(const std::string& run_id, const Checkpoint& c);
  bool record_telemetry(const std::string& run_id, const Telemetry& t);

  // Every sample, in insertion order; all runs when run_id is empty.
  std::vector<SampleRow> samples(const std::string& run_id = "");
  // One sample of a run, as samples() reads it; nullopt when there is none.
  std::optional<SampleRow> sample(const std::string& run_id, const std::string& sample_id);
  // A reviewer's decision on an unconfirmed verdict (launch confirm): confirmed makes it ok (its
  // speedup counts), rejected makes it hacked; the decision, the note and the time are kept in the
  // verdict's `review` and in the reviews table. The reward recorded when it was paid stays.
  // Returns "" or why nothing was changed (no such sample, not unconfirmed, the database).
  std::string review_sample(const std::string& run_id, const std::string& sample_id, bool confirm,
                            const std::string& note);
  // The largest group id among a run's samples (0: none).
  uint64_t max_group_id(const std::string& run_id);
  // A run's status: running, completed, failed or interrupted ("" when there is no such run).
  std::string run_status(const std::string& run_id);
  // The summary JSON a finished run was closed with ("" while it runs or when unknown).
  std::string summary(const std::string& run_id);
  // Ids of the runs in this store, oldest first.
  std::vector<std::string> runs();
  // Result of PRAGMA integrity_check ("ok" when healthy).
  std::string integrity_check();

  const std::string& last_error() const { return err_; }

 private:
  explicit Store(sqlite3* db) : db_(db) {}
  bool exec(const char* sql);
  std::vector<SampleRow> rows(const std::string& run_id, const std::string& sample_id);
  sqlite3* db_;
  std::string err_;
};

}  // namespace kernelrl

#include "store/store.hpp"

#include "core/paths.hpp"

#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include <cmath>

namespace kernelrl {

namespace {

const char* const schema = R"sql(
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, mode TEXT NOT NULL, config_toml TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'running', summary_json TEXT,
  created_at TEXT NOT NULL, finished_at TEXT);
CREATE TABLE IF NOT EXISTS samples (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id TEXT NOT NULL, sample_id TEXT NOT NULL, step INTEGER NOT NULL, task_id TEXT NOT NULL,
  group_id INTEGER NOT NULL, sample_index INTEGER NOT NULL,
  prompt TEXT NOT NULL, raw_action TEXT NOT NULL, assembled_code TEXT NOT NULL,
  compile_log TEXT NOT NULL, status TEXT NOT NULL, error TEXT NOT NULL,
  correctness_json TEXT NOT NULL, runtime_json TEXT NOT NULL, ref_runtime_json TEXT NOT NULL,
  speedup REAL NOT NULL, reward REAL NOT NULL,
  num_tokens INTEGER NOT NULL, logprob_sum REAL NOT NULL, logprob_mean REAL NOT NULL,
  policy_version INTEGER NOT NULL, sampler_id TEXT NOT NULL, evaluator_id TEXT NOT NULL,
  device TEXT NOT NULL, wall_s REAL NOT NULL, created_at TEXT NOT NULL,
  record BLOB NOT NULL,
  UNIQUE (run_id, sample_id));
CREATE INDEX IF NOT EXISTS samples_task ON samples (run_id, task_id);
CREATE TABLE IF NOT EXISTS steps (
  run_id TEXT NOT NULL, step INTEGER NOT NULL, stats_json TEXT NOT NULL, created_at TEXT NOT NULL,
  PRIMARY KEY (run_id, step));
CREATE TABLE IF NOT EXISTS checkpoints (
  run_id TEXT NOT NULL, step INTEGER NOT NULL, policy_version INTEGER NOT NULL, path TEXT NOT NULL,
  score REAL NOT NULL, created_at TEXT NOT NULL, PRIMARY KEY (run_id, step));
CREATE TABLE IF NOT EXISTS telemetry (
  run_id TEXT NOT NULL, ts REAL NOT NULL, source TEXT NOT NULL, step INTEGER NOT NULL,
  values_json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS reviews (
  run_id TEXT NOT NULL, sample_id TEXT NOT NULL, decision TEXT NOT NULL, note TEXT NOT NULL,
  previous_status TEXT NOT NULL, reviewed_at TEXT NOT NULL, PRIMARY KEY (run_id, sample_id));
)sql";

// A prepared statement that finalizes itself.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  Stmt& text(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& blob(int i, const void* p, size_t n) {
    sqlite3_bind_blob(s_, i, p, static_cast<int>(n), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& i64(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt& real(int i, double v) {
    sqlite3_bind_double(s_, i, std::isfinite(v) ? v : 0.0);
    return *this;
  }
  int step() { return sqlite3_step(s_); }
  std::string col_text(int i) {
    auto p = sqlite3_column_text(s_, i);
    return p ? reinterpret_cast<const char*>(p) : "";
  }
  int64_t col_i64(int i) { return sqlite3_column_int64(s_, i); }
  double col_real(int i) { return sqlite3_column_double(s_, i); }
  std::string col_blob(int i) {
    auto p = static_cast<const char*>(sqlite3_column_blob(s_, i));
    return p ? std::string(p, sqlite3_column_bytes(s_, i)) : std::string();
  }

 private:
  sqlite3_stmt* s_ = nullptr;
  int rc_;
};

nlohmann::json to_json(const RuntimeStats& r) {
  return {{"median_ms", r.median_ms}, {"mean_ms", r.mean_ms}, {"std_ms", r.std_ms},
          {"min_ms", r.min_ms},       {"max_ms", r.max_ms},   {"trials", r.trials}};
}

nlohmann::json to_json(const Correctness& c) {
  return {{"trials", c.trials},
          {"passed", c.passed},
          {"max_abs_diff", c.max_abs_diff},
          {"max_rel_diff", c.max_rel_diff},
          {"atol", c.atol},
          {"rtol", c.rtol},
          {"detail", c.detail},
          {"max_scale_err", c.max_scale_err},
          {"scale_tol", c.scale_tol},
          {"ref_noise", c.ref_noise},
          {"distributions", c.distributions},
          {"failed_distribution", c.failed_distribution},
          {"failed_seed", c.failed_seed}};
}

template <class T>
std::string pack(const T& v) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, v);
  return std::string(buf.data(), buf.size());
}

// Opens the database file with `flags`; nullptr (and `err` set) when it cannot.
sqlite3* open_db(const std::string& path, int flags, std::string& err) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, flags, nullptr) != SQLITE_OK) {
    err = path + ": cannot open store: " + (db ? sqlite3_errmsg(db) : "out of memory");
    sqlite3_close(db);
    return nullptr;
  }
  sqlite3_busy_timeout(db, 5000);
  return db;
}

}  // namespace

std::unique_ptr<Store> Store::open(const std::string& path, const std::string& synchronous, std::string& err) {
  sqlite3* db = open_db(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, err);
  if (!db) return nullptr;
  std::unique_ptr<Store> s(new Store(db));
  std::string pragmas =
      "PRAGMA journal_mode=WAL; PRAGMA synchronous=" + std::string(synchronous == "full" ? "FULL" : "NORMAL") + ";";
  if (!s->exec(pragmas.c_str()) || !s->exec(schema)) {
    err = path + ": cannot initialise store: " + s->err_;
    return nullptr;
  }
  return s;
}

std::unique_ptr<Store> Store::open_readonly(const std::string& path, std::string& err) {
  sqlite3* db = open_db(path, SQLITE_OPEN_READONLY, err);
  if (!db) return nullptr;
  std::unique_ptr<Store> s(new Store(db));
  Stmt st(db, "SELECT count(*) FROM samples");
  if (!st.ok()) {
    err = path + ": not a kernelrl store: " + sqlite3_errmsg(db);
    return nullptr;
  }
  return s;
}

Store::~Store() { sqlite3_close(db_); }

bool Store::exec(const char* sql) {
  char* msg = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &msg) != SQLITE_OK) {
    err_ = msg ? msg : sqlite3_errmsg(db_);
    sqlite3_free(msg);
    return false;
  }
  return true;
}

bool Store::begin_run(const std::string& run_id, const std::string& mode, const std::string& config_toml) {
  Stmt st(db_, "INSERT OR IGNORE INTO runs (run_id, mode, config_toml, created_at) VALUES (?,?,?,?)");
  st.text(1, run_id).text(2, mode).text(3, config_toml).text(4, iso_now());
  if (st.step() != SQLITE_DONE) {
    err_ = sqlite3_errmsg(db_);
    return false;
  }
  return true;
}

bool Store::finish_run(const std::string& run_id, const std::string& status, const std::string& summary_json) {
  Stmt st(db_, "UPDATE runs SET status = ?, summary_json = ?, finished_at = ? WHERE run_id = ?");
  st.text(1, status).text(2, summary_json).text(3, iso_now()).text(4, run_id);
  if (st.step() != SQLITE_DONE) {
    err_ = sqlite3_errmsg(db_);
    return false;
  }
  return true;
}

InsertResult Store::record_sample(const std::string& run_id, const ScoredRollout& s) {
  const auto& r = s.rollout;
  const auto& e = s.result;
  double lp_sum = 0;
  for (float x : r.logprobs) lp_sum += x;
  double lp_mean = r.logprobs.empty() ? 0.0 : lp_sum / static_cast<double>(r.logprobs.size());
  std::string record = pack(s);
  Stmt st(db_,
          "INSERT OR IGNORE INTO samples (run_id, sample_id, step, task_id, group_id, sample_index,"
          " prompt, raw_action, assembled_code, compile_log, status, error, correctness_json,"
          " runtime_json, ref_runtime_json, speedup, reward, num_tokens, logprob_sum, logprob_mean,"
          " policy_version, sampler_id, evaluator_id, device, wall_s, created_at, record)"
          " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  st.text(1, run_id)
      .text(2, r.sample_id)
      .i64(3, r.step)
      .text(4, r.task_id)
      .i64(5, static_cast<int64_t>(r.group_id))
      .i64(6, r.sample_index)
      .text(7, r.prompt)
      .text(8, r.completion)
      .text(9, e.assembled_code)
      .text(10, e.compile_log)
      .text(11, to_string(e.status))
      .text(12, e.error)
      .text(13, to_json(e.correctness).dump())
      .text(14, to_json(e.runtime).dump())
      .text(15, to_json(e.ref_runtime).dump())
      .real(16, e.speedup)
      .real(17, s.reward)
      .i64(18, static_cast<int64_t>(r.token_ids.size()))
      .real(19, lp_sum)
      .real(20, lp_mean)
      .i64(21, static_cast<int64_t>(r.policy_version))
      .text(22, r.sampler_id)
      .text(23, e.evaluator_id)
      .text(24, e.device)
      .real(25, e.wall_s)
      .text(26, iso_now())
      .blob(27, record.data(), record.size());
  if (st.step() != SQLITE_DONE) {
    err_ = sqlite3_errmsg(db_);
    return InsertResult::failed;
  }
  return sqlite3_changes(db_) == 1 ? InsertResult::inserted : InsertResult::duplicate;
}

nlohmann::json step_stats_json(const StepStats& s) {
  return {{"step", s.step},
          {"samples", s.samples},
          {"correct", s.correct},
          {"fast_1", s.fast_1},
          {"mean_speedup", s.mean_speedup},
          {"mean_reward", s.mean_reward},
          {"policy_version", s.policy_version},
          {"status_counts", s.status_counts}};
}

bool Store::record_step(const std::string& run_id, const StepStats& s, const std::map<std::string, double>& learner) {
  nlohmann::json j = step_stats_json(s);
  if (!learner.empty()) j["learner"] = learner;
  Stmt st(db_, "INSERT OR REPLACE INTO steps (run_id, step, stats_json, created_at) VALUES (?,?,?,?)");
  st.text(1, run_id).i64(2, s.step).text(3, j.dump()).text(4, iso_now());
  if (st.step() != SQLITE_DONE) {
    err_ = sqlite3_errmsg(db_);
    return false;
  }
  return true;
}

std::string Store::summary(const std::string& run_id) {
  Stmt st(db_, "SELECT summary_json FROM runs WHERE run_id = ?1");
  st.text(1, run_id);
  return st.step() == SQLITE_ROW ? st.col_text(0) : std::string();
}

std::vector<Store::StepRow> Store::steps(const std::string& run_id) {
  std::vector<StepRow> out;
  Stmt st(db_, "SELECT stats_json FROM steps WHERE run_id = ?1 ORDER BY step");
  st.text(1, run_id);
  while (st.step() == SQLITE_ROW) {
    StepRow r;
    try {
      auto j = nlohmann::json::parse(st.col_text(0));
      r.stats.step = j.at("step").get<uint32_t>();
      r.stats.samples = j.value("samples", uint64_t{0});
      r.stats.correct = j.value("correct", uint64_t{0});
      r.stats.fast_1 = j.value("fast_1", 0.0);
      r.stats.mean_speedup = j.value("mean_speedup", 0.0);
      r.stats.mean_reward = j.value("mean_reward", 0.0);
      r.stats.policy_version = j.value("policy_version", uint64_t{0});
      r.stats.status_counts = j.value("status_counts", std::map<std::string, uint64_t>{});
      r.learner = j.value("learner", std::map<std::string, double>{});
    } catch (const std::exception& e) {
      err_ = std::string("steps: unreadable row: ") + e.what();
      continue;
    }
    out.push_back(std::move(r));
  }
  return out;
}

bool Store::record_checkpoint(const std::string& run_id, const Checkpoint& c) {
  Stmt st(db_,
          "INSERT OR REPLACE INTO checkpoints (run_id, step, policy_version, path, score, created_at)"
          " VALUES (?,?,?,?,?,?)");
  st.text(1, run_id)
      .i64(2, c.step)
      .i64(3, static_cast<int64_t>(c.policy_version))
      .text(4, c.path)
      .real(5, c.score)
      .text(6, iso_now());
  if (st.step() != SQLITE_DONE) {
    err_ = sqlite3_errmsg(db_);
    return false;
  }
  return true;
}

bool Store::record_telemetry(const std::string& run_id, const Telemetry& t) {
  nlohmann::json values = t.values;
  Stmt st(db_, "INSERT INTO telemetry (run_id, ts, source, step, values_json) VALUES (?,?,?,?,?)");
  st.text(1, run_id).real(2, t.ts).text(3, t.source).i64(4, t.step).text(5, values.dump());
  if (st.step() != SQLITE_DONE) {
    err_ = sqlite3_errmsg(db_);
    return false;
  }
  return true;
}

namespace {

nlohmann::json stats_json(const RuntimeStats& s) {
  return {{"median_ms", s.median_ms}, {"mean_ms", s.mean_ms}, {"std_ms", s.std_ms},
          {"min_ms", s.min_ms},       {"max_ms", s.max_ms},   {"trials", s.trials}};
}

}  // namespace

nlohmann::json result_json(const EvalResult& r) {
  return {{"sample_id", r.sample_id},
          {"task_id", r.task_id},
          {"status", to_string(r.status)},
          {"error", r.error},
          {"speedup", r.speedup},
          {"runtime_ms", r.runtime.median_ms},
          {"ref_runtime_ms", r.ref_runtime.median_ms},
          {"runtime", stats_json(r.runtime)},
          {"ref_runtime", stats_json(r.ref_runtime)},
          {"correctness", to_json(r.correctness)},
          {"kernel_coverage", r.kernel_coverage},
          {"compile_s", r.compile_s},
          {"compile_cached", r.compile_cached},
          {"compile_log", r.compile_log},
          {"output", r.output},
          {"reverified", r.reverified},
          {"isolation_s", r.isolation_s},
          {"ready_at", r.ready_at},
          {"device_start", r.device_start},
          {"device_end", r.device_end},
          {"device_peak_bytes", r.device_peak_bytes},
          {"review", r.review},
          {"note", r.note},
          {"output_bytes", r.output_bytes},
          {"bound_ms", r.bound_ms},
          {"wall_s", r.wall_s},
          {"device", r.device},
          {"evaluator_id", r.evaluator_id}};
}

nlohmann::json sample_json(const SampleRow& r) {
  const auto& e = r.record.result;
  nlohmann::json j = result_json(e);
  j.update({
      {"run_id", r.run_id},
      {"sample_id", r.sample_id},
      {"task_id", r.task_id},
      {"step", r.step},
      {"group_id", r.group_id},
      {"sample_index", r.sample_index},
      {"status", r.status},
      {"error", r.error},
      {"speedup", r.speedup},
      {"reward", r.reward},
      {"policy_version", r.policy_version},
      {"num_tokens", r.num_tokens},
      {"logprob_mean", r.logprob_mean},
      {"completion", r.record.rollout.completion},
      {"prompt", r.record.rollout.prompt},
      {"prompt_tokens", r.record.rollout.prompt_tokens},
      {"turn", r.record.rollout.turn},
      {"parent_id", r.record.rollout.parent_id},
      {"token_ids", r.record.rollout.token_ids},
      {"logprobs", r.record.rollout.logprobs},
      {"sampler_id", r.record.rollout.sampler_id},
      {"split", r.record.rollout.split},
      {"assembled_code", e.assembled_code},
      {"compile_log", e.compile_log},
      {"output", e.output},
  });
  return j;
}

std::vector<SampleRow> Store::samples(const std::string& run_id) { return rows(run_id, ""); }

std::optional<SampleRow> Store::sample(const std::string& run_id, const std::string& sample_id) {
  auto r = rows(run_id, sample_id);
  if (r.empty()) return std::nullopt;
  return std::move(r.front());
}

std::string Store::review_sample(const std::string& run_id, const std::string& sample_id, bool confirm,
                                 const std::string& note) {
  auto row = sample(run_id, sample_id);
  if (!row) return "no sample " + sample_id + " in run " + run_id;
  if (row->status != "unconfirmed")
    return "sample " + sample_id + " is " + row->status + ", not unconfirmed: nothing to review";
  auto& e = row->record.result;
  const std::string when = iso_now();
  const std::string decision = confirm ? "confirmed" : "rejected";
  e.review += (e.review.empty() ? "" : " ") + ("[" + decision + " by review at " + when) +
              (note.empty() ? "" : ": " + note) + "]";
  if (confirm) {
    e.status = EvalStatus::ok;
  } else {
    e.status = EvalStatus::hacked;
    e.error = "rejected by review" + (note.empty() ? std::string() : ": " + note) + " (" + e.review + ")";
    e.speedup = 0;
  }
  std::string record = pack(row->record);
  if (!exec("BEGIN IMMEDIATE")) return err_;
  Stmt up(db_, "UPDATE samples SET status = ?, error = ?, speedup = ?, record = ? WHERE run_id = ? AND sample_id = ?");
  up.text(1, to_string(e.status)).text(2, e.error).real(3, e.speedup).blob(4, record.data(), record.size());
  up.text(5, run_id).text(6, sample_id);
  Stmt rv(db_,
          "INSERT OR REPLACE INTO reviews (run_id, sample_id, decision, note, previous_status, reviewed_at)"
          " VALUES (?,?,?,?,?,?)");
  rv.text(1, run_id).text(2, sample_id).text(3, decision).text(4, note).text(5, row->status).text(6, when);
  if (up.step() != SQLITE_DONE || rv.step() != SQLITE_DONE) {
    err_ = sqlite3_errmsg(db_);
    exec("ROLLBACK");
    return err_;
  }
  if (!exec("COMMIT")) return err_;
  return "";
}

uint64_t Store::max_group_id(const std::string& run_id) {
  Stmt st(db_, "SELECT COALESCE(MAX(group_id), 0) FROM samples WHERE run_id = ?");
  st.text(1, run_id);
  return st.step() == SQLITE_ROW ? static_cast<uint64_t>(st.col_i64(0)) : 0;
}

std::vector<SampleRow> Store::rows(const std::string& run_id, const std::string& sample_id) {
  std::vector<SampleRow> out;
  // One sample by the (run_id, sample_id) index, or a scan in insertion order.
  const std::string select =
      "SELECT run_id, sample_id, task_id, status, error, step, group_id, sample_index, speedup,"
      " reward, policy_version, num_tokens, logprob_mean, record FROM samples";
  const std::string sql = select + (sample_id.empty() ? " WHERE (?1 = '' OR run_id = ?1) ORDER BY seq"
                                                      : " WHERE run_id = ?1 AND sample_id = ?2");
  Stmt st(db_, sql.c_str());
  st.text(1, run_id);
  if (!sample_id.empty()) st.text(2, sample_id);
  while (st.step() == SQLITE_ROW) {
    SampleRow r;
    r.run_id = st.col_text(0);
    r.sample_id = st.col_text(1);
    r.task_id = st.col_text(2);
    r.status = st.col_text(3);
    r.error = st.col_text(4);
    r.step = static_cast<uint32_t>(st.col_i64(5));
    r.group_id = static_cast<uint64_t>(st.col_i64(6));
    r.sample_index = static_cast<uint32_t>(st.col_i64(7));
    r.speedup = st.col_real(8);
    r.reward = st.col_real(9);
    r.policy_version = static_cast<uint64_t>(st.col_i64(10));
    r.num_tokens = static_cast<uint32_t>(st.col_i64(11));
    r.logprob_mean = st.col_real(12);
    std::string blob = st.col_blob(13);
    try {
      auto h = msgpack::unpack(blob.data(), blob.size());
      h.get().convert(r.record);
    } catch (const std::exception& ex) {
      r.error += (r.error.empty() ? "" : "; ") + std::string("unreadable record: ") + ex.what();
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::string Store::run_status(const std::string& run_id) {
  Stmt st(db_, "SELECT status FROM runs WHERE run_id = ?");
  st.text(1, run_id);
  return st.step() == SQLITE_ROW ? st.col_text(0) : "";
}

std::vector<std::string> Store::runs() {
  std::vector<std::string> out;
  Stmt st(db_, "SELECT run_id FROM runs ORDER BY created_at, rowid");
  while (st.step() == SQLITE_ROW) out.push_back(st.col_text(0));
  return out;
}

std::string Store::integrity_check() {
  Stmt st(db_, "PRAGMA integrity_check");
  std::string out;
  while (st.step() == SQLITE_ROW) out += (out.empty() ? "" : "\n") + st.col_text(0);
  return out;
}

}  // namespace kernelrl

// The run store: every artifact kept, idempotent by sample id, and safe against a writer killed
// with SIGKILL in the middle of a run.
#include "store/store.hpp"

#include "core/files.hpp"
#include "core/paths.hpp"

#include "message_samples.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <csignal>
#include <filesystem>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace kernelrl;
using namespace kernelrl::test;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path dir;
  explicit TempDir(const std::string& tag) {
    dir = fs::temp_directory_path() / ("kernelrl-" + tag + "-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
};

ScoredRollout numbered(uint64_t i) {
  ScoredRollout s = sample_scored();
  s.rollout.sample_id = "s" + std::to_string(i);
  s.rollout.sample_index = static_cast<uint32_t>(i);
  s.result.sample_id = s.rollout.sample_id;
  s.result.assembled_code = std::string(4096, 'x');  // realistic row size
  s.reward = static_cast<double>(i);
  return s;
}

}  // namespace

TEST_CASE("the store keeps every artifact of a sample and reads it back", "[store]") {
  TempDir t("store");
  std::string err;
  auto s = Store::open((t.dir / "store.sqlite").string(), "normal", err);
  REQUIRE(s);
  REQUIRE(s->begin_run("run-1", "eval", "[tasks]\n"));
  auto x = sample_scored();
  CHECK(s->record_sample("run-1", x) == InsertResult::inserted);
  CHECK(s->record_step("run-1", sample_step()));
  CHECK(s->record_checkpoint("run-1", sample_checkpoint()));
  CHECK(s->record_telemetry("run-1", sample_telemetry()));
  CHECK(s->finish_run("run-1", "completed", "{}"));
  auto rows = s->samples("run-1");
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].record == x);
  CHECK(rows[0].status == "incorrect");
  CHECK(rows[0].sample_id == x.rollout.sample_id);
  CHECK(rows[0].policy_version == 42);
  CHECK(rows[0].num_tokens == 4);
  CHECK(rows[0].logprob_mean == Approx((-0.25 - 1.5 - 0.0 - 12.75) / 4));
  CHECK(s->runs() == std::vector<std::string>{"run-1"});
  CHECK(s->integrity_check() == "ok");
}

TEST_CASE("a sample recorded twice is stored once", "[store]") {
  TempDir t("store-dup");
  std::string err;
  auto s = Store::open((t.dir / "store.sqlite").string(), "normal", err);
  REQUIRE(s);
  REQUIRE(s->begin_run("r", "eval", ""));
  CHECK(s->record_sample("r", numbered(1)) == InsertResult::inserted);
  auto again = numbered(1);
  again.reward = 99;
  CHECK(s->record_sample("r", again) == InsertResult::duplicate);
  CHECK(s->record_sample("r", numbered(2)) == InsertResult::inserted);
  auto rows = s->samples("r");
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].reward == 1.0);  // the first copy wins
}

TEST_CASE("opening something that is not a store is a clear error", "[store]") {
  TempDir t("store-bad");
  std::string err;
  CHECK_FALSE(Store::open_readonly((t.dir / "absent.sqlite").string(), err));
  CHECK(err.find("absent.sqlite: cannot open store") != std::string::npos);
  std::ofstream(t.dir / "garbage.sqlite") << "this is not a database, just text padding it out....";
  err.clear();
  CHECK_FALSE(Store::open_readonly((t.dir / "garbage.sqlite").string(), err));
  CHECK(err.find("garbage.sqlite") != std::string::npos);
}

TEST_CASE("a writer killed with SIGKILL mid-run leaves a store that opens cleanly", "[store][crash]") {
  TempDir t("store-crash");
  std::string path = (t.dir / "store.sqlite").string();
  {
    std::string err;
    auto s = Store::open(path, "normal", err);
    REQUIRE(s);
    REQUIRE(s->begin_run("r", "eval", ""));
  }
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // the writer: records samples as fast as it can until it is killed
    std::string err;
    auto s = Store::open(path, "normal", err);
    if (!s) _exit(3);
    for (uint64_t i = 0;; ++i)
      if (s->record_sample("r", numbered(i)) != InsertResult::inserted) _exit(4);
  }
  // Wait until the writer is well into its run, then kill it without warning.
  size_t seen = 0;
  for (int i = 0; i < 600 && seen < 300; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::string err;
    if (auto r = Store::open_readonly(path, err)) seen = r->samples("r").size();
  }
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(seen >= 300);

  std::string err;
  auto s = Store::open(path, "normal", err);
  REQUIRE(s);
  CHECK(s->integrity_check() == "ok");
  auto rows = s->samples("r");
  CHECK(rows.size() >= seen);
  // Every row is whole and they are exactly s0..s(n-1): nothing torn, nothing skipped.
  for (size_t i = 0; i < rows.size(); ++i) {
    INFO("row " << i);
    CHECK(rows[i].sample_id == "s" + std::to_string(i));
    CHECK(rows[i].record.rollout.sample_id == rows[i].sample_id);
    CHECK(rows[i].record.result.assembled_code.size() == 4096);
  }
  // And the store still takes writes.
  CHECK(s->record_sample("r", numbered(rows.size())) == InsertResult::inserted);
}

TEST_CASE("list_checkpoints passes over step folders that are not whole and says why", "[store]") {
  const fs::path dir = fs::temp_directory_path() / ("kernelrl-ckpt-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto write = [](const fs::path& f, const std::string& text) {
    fs::create_directories(f.parent_path());
    std::ofstream(f) << text;
  };
  write(dir / "step-1" / "learner.json", "{\"version\": 1}");  // before manifests: counts
  write(dir / "step-2" / "learner.json", "");                  // empty: passed over
  write(dir / "step-3" / "learner.json", "{\"version\": 3}");
  write(dir / "step-3" / "adapter.bin", "0123456789");
  std::string err;
  REQUIRE(write_manifest((dir / "step-3").string(), err));
  write(dir / "step-4" / "learner.json", "{\"version\": 4}");
  write(dir / "step-4" / "adapter.bin", "0123456789");
  REQUIRE(write_manifest((dir / "step-4").string(), err));
  fs::resize_file(dir / "step-4" / "adapter.bin", 3);  // a disk that filled
  write(dir / "notes" / "x.txt", "not a checkpoint");
  std::vector<std::string> passed_over;
  auto found = list_checkpoints(dir.string(), &passed_over);
  REQUIRE(found.size() == 2);
  CHECK(found[0].first == 1);
  CHECK(found[1].first == 3);
  REQUIRE(passed_over.size() == 2);
  std::sort(passed_over.begin(), passed_over.end());
  CHECK(passed_over[0].find("step-2: no manifest.json and an empty or missing learner.json") != std::string::npos);
  CHECK(passed_over[1].find("step-4: ") != std::string::npos);
  CHECK(passed_over[1].find("adapter.bin") != std::string::npos);
  fs::remove_all(dir);
}

// Small shared helpers: run directories and clocks.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kernelrl {

// Creates ROOT/NAME-YYYYmmdd-HHMMSS[-N] (a fresh directory, mode 0750) and returns its absolute path.
std::string make_run_dir(const std::string& root, const std::string& name);

// A learner's checkpoint of policy version N: CHECKPOINTS/step-N.
std::string checkpoint_dir(const std::string& checkpoints, uint64_t version);
// The complete checkpoints in CHECKPOINTS (step-N folders whose manifest.json verifies, by
// size; an interrupted step-N.partial is not one), as (N, path), N ascending. None when the
// folder does not exist.
// `passed_over`, when given, receives each step-N folder left out and why.
std::vector<std::pair<uint64_t, std::string>> list_checkpoints(const std::string& checkpoints,
                                                               std::vector<std::string>* passed_over = nullptr);

// Deletes `path` and everything under it (symlinks are removed, not followed); true when nothing
// is left, else false and `err` says what could not be removed. A missing path is not an error.
// Use it instead of std::filesystem::remove_all, which crashes in binaries that link LibTorch
// (libtorch.so exports a broken copy of that symbol, and it wins the lookup).
bool remove_tree(const std::string& path, std::string& err);

// This process's folder for temporary files: $TMPDIR/kernelrl-PID-XXXXXX (mode 0711), made on
// first use and removed when the process exits; every worker's socket, locks and candidates'
// folders go under it. Its first call also removes the folders of kernelrl processes that no
// longer run (a killed run's). "" when it cannot be made (then callers use $TMPDIR itself).
const std::string& process_temp_dir();

// Seconds since the Unix epoch (wall clock, for timestamps).
double now_s();
// Seconds on a monotonic clock (for durations and rates).
double mono_s();
// ISO-8601 UTC timestamp, e.g. 2026-11-22T02:23:00Z.
std::string iso_now();

// The kernelrl source tree (gpu/worker.py, scripts/python, tasks/): $KERNELRL_ROOT when set
// (a build carried to another machine), else the tree this binary was built from.
std::string source_dir();

}  // namespace kernelrl

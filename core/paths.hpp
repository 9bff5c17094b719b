// Small shared helpers: run directories, clocks, file reading.
#pragma once

#include <string>

namespace kernelrl {

// Creates ROOT/NAME-YYYYmmdd-HHMMSS[-N] (a fresh directory) and returns its absolute path.
std::string make_run_dir(const std::string& root, const std::string& name);

// Seconds since the Unix epoch (wall clock, for timestamps).
double now_s();
// Seconds on a monotonic clock (for durations and rates).
double mono_s();
// ISO-8601 UTC timestamp, e.g. 2026-11-22T02:23:00Z.
std::string iso_now();

// Reads a whole file; false (and `err` set) when it cannot.
bool read_file(const std::string& path, std::string& out, std::string& err);

}  // namespace kernelrl

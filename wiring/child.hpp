// Child `launch` processes: the arms of a comparison and the tasks of a per-task run each run as
// `launch CONFIG --run-dir DIR` of their own.
#pragma once

#include <string>
#include <vector>

namespace kernelrl {

// Runs argv as a child process (stdout to the file `out` when given); its exit status (128 + the
// signal when one ended it), or -1 when it could not be started.
int run_child(const std::vector<std::string>& argv, const std::string& out = "");
// Starts argv as a child process (stdout and stderr to the file `log` when given) without waiting;
// its pid, or -1 when it could not be started.
int start_child(const std::vector<std::string>& argv, const std::string& log = "");
// Waits up to timeout_s for child `pid`; true once it has exited, false (and it is killed) after.
bool finish_child(int pid, double timeout_s);
// This executable's path (/proc/self/exe), or "launch".
std::string self_exe();
// A child run's folder that holds an unfinished run (a store, no compute.json): its store removed,
// so that the child starts it again from nothing (a launch refuses a folder whose store holds its
// run). True when there was one.
bool clear_unfinished(const std::string& dir);

}  // namespace kernelrl

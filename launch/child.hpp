// Child `launch` processes: the arms of a comparison and the tasks of a per-task run each run as
// `launch CONFIG --run-dir DIR` of their own.
#pragma once

#include <string>
#include <vector>

namespace kernelrl {

// Runs argv as a child process (stdout to the file `out` when given); its exit status (128 + the
// signal when one ended it), or -1 when it could not be started.
int run_child(const std::vector<std::string>& argv, const std::string& out = "");
// This executable's path (/proc/self/exe), or "launch".
std::string self_exe();

}  // namespace kernelrl

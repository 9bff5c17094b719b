// Logging: one spdlog logger per component ("supervisor", "evaluator", ...), all writing to the
// terminal (stderr) and, once a run directory exists, to RUN_DIR/launch.log.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace kernelrl::log {

// Sets the level of every logger, present and future: trace, debug, info, warn, error, off.
// Returns false (and changes nothing) for an unknown level name.
bool set_level(const std::string& level);
// The monitor's progress line is on the terminal without its newline: the next log line clears
// its row first.
void progress_line_shown();

// Adds RUN_DIR/launch.log as a sink of every logger, present and future.
void add_run_file(const std::string& path);

// The logger of one component, created on first use.
std::shared_ptr<spdlog::logger> get(const std::string& component);

}  // namespace kernelrl::log

// monitor: every interval, asks its sources (supervisor, dispatcher, ...) for Telemetry, merges
// it into one snapshot, shows a live progress line on the terminal (stderr), appends the snapshot
// to RUN_DIR/metrics.jsonl and hands it to the recorder for the store. Asking never blocks the
// sources; a source that does not answer within the interval is skipped for that tick.
// Messages in:  (tick_atom) (self); (finish_atom) -> bool, after a last snapshot
#pragma once

#include <caf/fwd.hpp>

#include <string>
#include <vector>

namespace kernelrl {

struct MonitorArgs {
  bool progress = true;            // draw the progress line
  double interval_s = 1.0;         // refresh interval
  std::string metrics_path;        // metrics.jsonl ("" : none)
  std::string label = "eval";      // shown at the start of the progress line
};

// `recorder` receives (record_atom, Telemetry) for each snapshot; may be invalid.
caf::actor spawn_monitor(caf::actor_system& sys, MonitorArgs args, std::vector<caf::actor> sources,
                         caf::actor recorder);

// The progress line for a merged snapshot (exposed for tests).
std::string format_progress(const std::string& label, const std::vector<std::pair<std::string, double>>& values);

}  // namespace kernelrl

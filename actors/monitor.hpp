// monitor: every interval, asks its sources (supervisor, dispatcher, ...) for Telemetry, merges
// it into one snapshot, shows a live progress line on the terminal (stderr), appends the snapshot
// to RUN_DIR/metrics.jsonl and hands it to the recorder for the store. Asking never blocks the
// sources; a source that does not answer within the interval is skipped for that tick.
// With a publisher, each snapshot also goes out on a ZeroMQ PUB socket: two frames, the topic
// "kernelrl.telemetry" and the Telemetry as a msgpack map {ts, source, step, values}.
// Its interface is monitor_actor (messages/interfaces.hpp): (tick_atom) (self); (finish_atom) ->
// bool, after a last snapshot; (stats_atom) -> Telemetry, the latest merged snapshot (source
// "cluster"; the gate serves it to `launch monitor HOST:PORT`); (register_atom, actor, id): one
// more source (a sampler that joined from another node).
#pragma once

#include "messages/interfaces.hpp"

#include <caf/fwd.hpp>

#include <memory>
#include <string>
#include <vector>

namespace kernelrl {

struct Telemetry;

// A bound ZeroMQ PUB socket for telemetry snapshots (other tools subscribe to it).
class TelemetryPublisher {
 public:
  // Binds `endpoint` ("tcp://HOST:PORT", "ipc://PATH"); nullptr and `err` on failure. With a
  // CURVE secret key (Z85) the socket is a CURVE server that admits only `clients` (their public
  // keys, checked by a ZAP handler of its own); everyone else is refused in the handshake.
  static std::unique_ptr<TelemetryPublisher> bind(const std::string& endpoint, std::string& err,
                                                  const std::string& curve_secret = "",
                                                  const std::vector<std::string>& clients = {});
  ~TelemetryPublisher();
  void publish(const Telemetry& t);  // never blocks: a slow subscriber loses snapshots, not the run
  const std::string& endpoint() const;
  uint64_t refused() const;  // CURVE handshakes refused (a key not among the clients)

 private:
  TelemetryPublisher();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

inline const char* telemetry_topic = "kernelrl.telemetry";

struct MonitorArgs {
  bool progress = true;                           // draw the progress line
  double interval_s = 1.0;                        // refresh interval
  std::string metrics_path;                       // metrics.jsonl ("" : none)
  std::string label = "eval";                     // shown at the start of the progress line
  std::shared_ptr<TelemetryPublisher> publisher;  // each snapshot also published here (may be null)
};

// `recorder` receives (record_atom, Telemetry) for each snapshot; may be invalid.
monitor_actor spawn_monitor(caf::actor_system& sys, MonitorArgs args, std::vector<telemetry_source> sources,
                            telemetry_recorder recorder);

// The progress line for a merged snapshot (exposed for tests).
std::string format_progress(const std::string& label, const std::vector<std::pair<std::string, double>>& values);

// A progress line made to fit `width` columns: its " | "-separated fields are left out, the least
// useful first (in flight, queue, entropy, ...), keeping the first (where the run is) and the ETA;
// cut at the width only when those two alone do not fit.
std::string fit_progress(const std::string& line, size_t width);

// The snapshot as a few lines for people: progress, speedup distribution, reward histogram,
// one line per node (evaluators, work held, utilisation), sampler and learner figures.
std::string format_snapshot(const std::string& label, const std::vector<std::pair<std::string, double>>& values);

}  // namespace kernelrl

// SIGINT and SIGTERM caught for as long as a StopSignals lives: the first one calls `on_stop` with
// the signal, from a thread of its own (the handler only writes to a pipe); a second one ends the
// process at once (the default action). Workers and other children are started with exec, which
// resets caught signals to their defaults.
#pragma once

#include <atomic>
#include <functional>
#include <thread>

namespace kernelrl {

class StopSignals {
 public:
  explicit StopSignals(std::function<void(int)> on_stop);
  ~StopSignals();  // the defaults back; the thread ended
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The first signal caught (0: none).
  int caught() const { return caught_.load(); }

 private:
  std::atomic<int> caught_{0};
  std::thread thread_;
};

// "SIGINT", "SIGTERM", or "signal N".
const char* signal_name(int sig);

}  // namespace kernelrl

#include "launch/stop_signals.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

namespace kernelrl {

namespace {
int stop_pipe[2] = {-1, -1};
std::atomic<int> signals_seen{0};

void on_signal(int sig) {
  if (signals_seen.fetch_add(1) > 0) {  // a second one: no more waiting
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  const char c = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = ::write(stop_pipe[1], &c, 1);
}
}  // namespace

StopSignals::StopSignals(std::function<void(int)> on_stop) {
  if (::pipe2(stop_pipe, O_CLOEXEC) != 0) return;  // no pipe: the defaults stay
  signals_seen = 0;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  thread_ = std::thread([this, on_stop = std::move(on_stop)] {
    for (;;) {
      char c = 0;
      const ssize_t n = ::read(stop_pipe[0], &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n != 1 || c == 0) return;  // closed, or the destructor's 0
      caught_ = c;
      on_stop(c);
    }
  });
}

StopSignals::~StopSignals() {
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (thread_.joinable()) {
    const char zero = 0;
    [[maybe_unused]] ssize_t n = ::write(stop_pipe[1], &zero, 1);
    thread_.join();
  }
  for (int& fd : stop_pipe)
    if (fd >= 0) ::close(fd), fd = -1;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "a signal";
  }
}

}  // namespace kernelrl

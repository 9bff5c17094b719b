#include "core/log.hpp"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <vector>

namespace kernelrl::log {

namespace {
std::atomic<bool> progress_up{false};  // a progress line without its newline is on the terminal

// The terminal's sink: a log line that arrives while the monitor's progress line is up first
// clears that row, so that the line starts at the left edge (the monitor redraws on its next tick).
class TerminalSink : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (progress_up.exchange(false)) std::fputs("\r\033[K", stderr);
    inner_->log(msg);
  }
  void flush_() override { inner_->flush(); }
  void set_pattern_(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter_(std::unique_ptr<spdlog::formatter> f) override { inner_->set_formatter(std::move(f)); }

 private:
  std::shared_ptr<spdlog::sinks::stderr_color_sink_mt> inner_ = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
};

struct Registry {
  std::mutex mu;
  std::vector<spdlog::sink_ptr> sinks{std::make_shared<TerminalSink>()};
  spdlog::level::level_enum level = spdlog::level::info;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

void progress_line_shown() { progress_up = true; }

bool set_level(const std::string& level) {
  auto lv = spdlog::level::from_str(level);
  if (lv == spdlog::level::off && level != "off") return false;
  auto& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  r.level = lv;
  spdlog::apply_all([lv](const std::shared_ptr<spdlog::logger>& l) { l->set_level(lv); });
  return true;
}

void add_run_file(const std::string& path) {
  auto& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, false);
  r.sinks.push_back(sink);
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& l) { l->sinks().push_back(sink); });
}

std::shared_ptr<spdlog::logger> get(const std::string& component) {
  auto& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  if (auto l = spdlog::get(component)) return l;
  auto l = std::make_shared<spdlog::logger>(component, r.sinks.begin(), r.sinks.end());
  l->set_level(r.level);
  l->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%-5l%$ [%n] %v");
  l->flush_on(spdlog::level::info);
  spdlog::register_logger(l);
  return l;
}

}  // namespace kernelrl::log

namespace kernelrl::log {

void info(const std::string& component, const std::string& message) { get(component)->info("{}", message); }
void error(const std::string& component, const std::string& message) { get(component)->error("{}", message); }

}  // namespace kernelrl::log

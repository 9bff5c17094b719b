#include "core/log.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>
#include <vector>

namespace kernelrl::log {

namespace {
struct Registry {
  std::mutex mu;
  std::vector<spdlog::sink_ptr> sinks{std::make_shared<spdlog::sinks::stderr_color_sink_mt>()};
  spdlog::level::level_enum level = spdlog::level::info;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

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

// One log line through a component's logger (core/log.hpp) without spdlog's headers: for the
// translation units that include torch, whose bundled fmt differs from the one spdlog uses.
#pragma once

#include <string>

namespace kernelrl::log {

void info(const std::string& component, const std::string& message);
void error(const std::string& component, const std::string& message);

}  // namespace kernelrl::log

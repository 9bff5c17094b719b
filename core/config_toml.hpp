#pragma once
// The config reader over an already parsed TOML table (comparison configs merge each arm into
// the file's tables first). Its errors are located at the nodes' own source positions, which
// toml++ keeps through moves (not through copies).

#include "core/config.hpp"

#include <toml++/toml.h>

#include <string>

namespace kernelrl {

// The config in `root`, read from the file `path` (relative paths resolve against its folder).
ConfigResult read_config(const toml::table& root, const std::string& path);

}  // namespace kernelrl

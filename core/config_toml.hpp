#pragma once
// The config reader over an already parsed TOML table (comparison configs merge each arm into
// the file's tables first). Its errors are located at the nodes' own source positions, which
// toml++ keeps through moves (not through copies).

#include "core/config.hpp"

#include <toml++/toml.h>

#include <string>
#include <vector>

namespace kernelrl {

// The config in `root`, read from the file `path` (relative paths resolve against its folder).
ConfigResult read_config(const toml::table& root, const std::string& path);

// Command-line overrides (`launch CONFIG --set learner.learning_rate=2e-5`), applied to `root` in
// order: KEY=VALUE, KEY a dotted path of tables and a key (missing tables are made; a key that
// is an array of tables, such as node, can't be set), VALUE a TOML value (2e-5, true, "text",
// [1, 2]; a bare word that is not one is taken as a string: policy.model=/models/qwen). Each
// malformed one is an error naming it; false then.
bool apply_overrides(toml::table& root, const std::vector<std::string>& sets, std::vector<ConfigError>& errs);

// The errors of keys an override gave point at that override ("--set KEY=VALUE: KEY: message")
// instead of at the file.
void blame_overrides(std::vector<ConfigError>& errs, const std::vector<std::string>& sets);

}  // namespace kernelrl

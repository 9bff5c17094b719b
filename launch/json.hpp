// Reading a JSON file (the JSON forms of verdicts and samples are the store's: store/store.hpp).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace kernelrl {

// The JSON in the file `path`; null and `err` ("PATH: cannot read" or "PATH: not valid JSON") when
// it cannot be read or parsed.
nlohmann::json read_json_file(const std::string& path, std::string& err);

}  // namespace kernelrl

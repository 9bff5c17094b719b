// JSON forms shared by `launch evaluate` and `launch export`, and reading a JSON file.
#pragma once

#include "messages/messages.hpp"

#include <nlohmann/json.hpp>

namespace kernelrl {

// Every field of a verdict: status, error, speedup, runtime_ms, ref_runtime_ms, full timing
// statistics, correctness, kernel_coverage, compile_s, compile_cached, reverified, isolation_s...
// (not the assembled code and compile log, which callers add when they want them).
nlohmann::json result_json(const EvalResult& r);

// The JSON in the file `path`; null and `err` ("PATH: cannot read" or "PATH: not valid JSON") when
// it cannot be read or parsed.
nlohmann::json read_json_file(const std::string& path, std::string& err);

}  // namespace kernelrl

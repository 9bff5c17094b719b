// JSON forms shared by `launch evaluate` and `launch export`.
#pragma once

#include "messages/messages.hpp"

#include <nlohmann/json.hpp>

namespace kernelrl {

// Every field of a verdict: status, error, speedup, runtime_ms, ref_runtime_ms, full timing
// statistics, correctness, kernel_coverage, compile_s, compile_cached, reverified, isolation_s...
// (not the assembled code and compile log, which callers add when they want them).
nlohmann::json result_json(const EvalResult& r);

}  // namespace kernelrl

#include "core/mode.hpp"

#include <array>

namespace kernelrl {

namespace {
constexpr std::array<ModeTraits, 5> kModes = {{
    // name        learns adapts holds_out selects objective
    {"eval", false, false, false, false, ""},
    {"best_of_n", false, false, false, true, ""},
    {"train", true, false, true, false, "grpo"},
    {"ttt", true, true, false, false, "grpo"},
    {"sdpo", true, true, false, false, "sdpo"},
}};
}  // namespace

const ModeTraits& traits(Mode m) { return kModes[static_cast<size_t>(m)]; }

std::optional<Mode> parse_mode(std::string_view text) {
  for (size_t i = 0; i < kModes.size(); ++i)
    if (text == kModes[i].name) return static_cast<Mode>(i);
  return std::nullopt;
}

std::vector<std::string> mode_names() {
  std::vector<std::string> out;
  for (auto& t : kModes) out.emplace_back(t.name);
  return out;
}

}  // namespace kernelrl

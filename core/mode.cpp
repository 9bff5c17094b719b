#include "core/mode.hpp"

#include <array>

namespace kernelrl {

namespace {
constexpr std::array<ModeTraits, static_cast<size_t>(kLastMode) + 1> kModes = {{
    // mode           name        learns adapts holds_out selects objective
    {Mode::eval, "eval", false, false, false, false, ""},
    {Mode::best_of_n, "best_of_n", false, false, false, true, ""},
    {Mode::train, "train", true, false, true, false, "grpo"},
    {Mode::ttt, "ttt", true, true, false, false, "grpo"},
    {Mode::sdpo, "sdpo", true, true, false, false, "sdpo"},
}};

// Every row in the enum's order, each with a name (a row left out leaves a zeroed one, no name).
constexpr bool rows_in_order() {
  for (size_t i = 0; i < kModes.size(); ++i)
    if (static_cast<size_t>(kModes[i].mode) != i || kModes[i].name == nullptr) return false;
  return true;
}
static_assert(rows_in_order(), "core/mode.cpp: kModes must hold one row per Mode, in the enum's order");
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

#pragma once
// An experiment's mode ([experiment] mode), parsed once by the config reader; everything else asks
// its traits instead of comparing names.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kernelrl {

enum class Mode {
  eval,       // sample and evaluate each task (replay or a model), no learning
  best_of_n,  // K samples per task, for selection strategies
  train,      // RLVR: [learner] steps of GRPO over batches of the tasks
  ttt,        // test-time adaptation: every step learns on all the tasks
  sdpo,       // ttt's loop, learning by self-distillation ([sdpo])
};
// The last of Mode's enumerators: a mode added after it moves this too, and core/mode.cpp's table
// then fails to compile until the mode has its row.
inline constexpr Mode kLastMode = Mode::sdpo;

struct ModeTraits {
  Mode mode;              // the row's mode: the table's rows are in the enum's order (checked)
  const char* name;       // as written in the config
  bool learns;            // a learner updates the policy step by step
  bool adapts;            // every step samples every task (ttt's loop), not a batch of them
  bool holds_out;         // may evaluate held-out tasks periodically ([experiment] eval_split, eval_ids)
  bool selects;           // K samples per task for selection ([experiment] k, evaluate_top_m)
  const char* objective;  // the learner's objective: "grpo" or "sdpo" ("" when it does not learn)
};

const ModeTraits& traits(Mode m);
inline const char* name(Mode m) { return traits(m).name; }
// The mode called `text`, or none.
std::optional<Mode> parse_mode(std::string_view text);
// Every mode's name, in declaration order.
std::vector<std::string> mode_names();

}  // namespace kernelrl

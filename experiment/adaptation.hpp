#pragma once
// What a learning experiment decides from its scores, without actors: Best-of-Adaptation and
// early stopping, and which task each group of a train step samples. The ttt and sdpo experiment
// (class Adaptation, declared in experiment/training.hpp) is defined in adaptation.cpp.

#include <cstddef>
#include <cstdint>

namespace kernelrl {

// Best-of-Adaptation and early stopping over per-step scores (each step's fast_1): the best step
// is the highest score, the earliest on a tie. With patience P > 0 the run stops once P steps in a
// row have not beaten it, or, with `regressions`, once P steps in a row have each scored below the
// step before.
struct AdaptationTracker {
  uint32_t patience = 0;     // 0: never stop early
  bool regressions = false;  // the rule: P consecutive regressions (true) or P steps without a new best
  double last = 0;           // the previous step's score
  uint32_t falling = 0;      // consecutive steps below the step before
  double best = 0;
  uint32_t best_step = 0;
  uint32_t since_best = 0;  // steps since the best
  bool any = false;         // a score was recorded
  // Records `step`'s score; true when the run should stop.
  bool record(uint32_t step, double score);
};

// Task `i` of the endless training sequence: epoch i / n is a shuffle of `n` tasks by `seed`.
size_t train_task_index(uint64_t seed, size_t n, uint64_t i);

}  // namespace kernelrl

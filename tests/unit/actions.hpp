// Test helper: the actions of one kind among an experiment's answer.
#pragma once

#include "experiment/experiment.hpp"

#include <variant>
#include <vector>

namespace kernelrl::test {

template <class A>
std::vector<A> of(const Actions& xs) {
  std::vector<A> out;
  for (auto& x : xs)
    if (auto* a = std::get_if<A>(&x)) out.push_back(*a);
  return out;
}

}  // namespace kernelrl::test
